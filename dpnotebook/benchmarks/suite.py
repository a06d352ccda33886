"""The benchmark suite: which configurations to run, and running each in its own process.

Each configuration (model, B, K, what) runs in a fresh subprocess, so that its
peak resident memory (``VmHWM``, i.e. ``ru_maxrss`` without what the parent
process passed on; reset before the first step) is its own. Inside, after warm-up, its
steps are timed *alternately* with the non-private reference step on the same
rows, so the ratio compares the two under the same machine load (other
processes slow both alike). See :mod:`dpnotebook.benchmarks.steps` for the names.

>>> [c.what for c in plan(["MLP"], [8], modes=["ghost"], kinds=["dpsgd"], ks=[1])]
['nonprivate', 'dpsgd_ghost']
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

from dpnotebook.benchmarks.rss import peak_mb, reset_peak, rss_mb
from dpnotebook.benchmarks.steps import MODES, OPACUS_MODES, make_step

#: Models whose DP flavour swaps in dpnotebook's DP layers (so a second non-private row is shown).
DP_LAYER_MODELS = ("TextTransformer", "LSTMClassifier")
KINDS = ("gsm", "dpsgd", "naive")


@dataclass(frozen=True)
class Config:
    """One row of the results: ``what`` (see :mod:`~dpnotebook.benchmarks.steps`) on ``model`` with B samples of K rows."""

    model: str
    batch: int
    K: int
    what: str


def plan(
    models: Iterable[str],
    batches: Iterable[int],
    *,
    modes: Iterable[str] = MODES,
    kinds: Iterable[str] = KINDS,
    ks: Iterable[int] = (1,),
    k_batch: int = 32,
    k_modes: Iterable[str] = ("hooks", "ghost"),
    opacus: bool = False,
) -> list[Config]:
    """The configurations to run, in order.

    Args:
        models, batches: the grid for K=1.
        modes: dpnotebook grad-sample modes.
        kinds: ``"gsm"`` (per-sample gradients only), ``"dpsgd"``, ``"naive"`` (microbatching).
        ks: augmentation multiplicities; each K > 1 runs at B=``k_batch``, with the
            non-private step on the same B*K rows and ``k_modes``.
        opacus: add Opacus' configurations (K=1).
    """
    modes, kinds, ks = list(modes), list(kinds), list(ks)
    out: list[Config] = []
    for m in models:
        for B in batches:
            whats = ["nonprivate"] + (["nonprivate_dplayers"] if m in DP_LAYER_MODELS else [])
            for kind in ("gsm", "dpsgd"):
                if kind in kinds:
                    whats += [f"{kind}_{mode}" for mode in modes]
                    if opacus:
                        whats += [f"opacus_{kind}_{mode}" for mode in OPACUS_MODES if (kind, mode) != ("gsm", "ghost")]
            whats += ["naive_microbatch"] if "naive" in kinds else []
            out += [Config(m, B, 1, w) for w in whats]
        for K in ks if any(k > 1 for k in ks) else []:
            if K == 1 and k_batch in batches:
                continue
            whats = ["nonprivate"] + [
                f"{kind}_{mode}" for kind in ("gsm", "dpsgd") if kind in kinds for mode in k_modes
            ]
            out += [Config(m, k_batch, K, w) for w in whats]
    return out


def _timer(device: str) -> Callable[[Callable[[], None]], float]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(step: Callable[[], None]) -> float:
        sync()
        start = time.perf_counter()
        step()
        sync()
        return (time.perf_counter() - start) * 1e3

    return timed


def measure(
    cfg: Config,
    *,
    steps: int = 10,
    warmup: int = 3,
    device: str = "cpu",
    threads: int = 2,
    min_seconds: float = 0.0,
    max_steps: int = 200,
    rival: bool = False,
) -> dict:
    """Run one configuration in this process: its time, its ratio to the non-private step, its memory.

    ``rss0_mb`` is the resident memory once the model and data are built;
    ``peak_mb`` the peak during the warm-up steps (read before the reference
    model is built), so ``peak_mb - rss0_mb`` is what the step itself needs.
    With ``rival``, a ghost configuration also times the same configuration in hooks mode in
    each round (``rival_median_ms``, ``rival_min_ms``): the two modes under the same load.
    Then rounds, each timing one reference step and one step of the
    configuration: at least ``steps`` of them, and more until the rounds have
    taken ``min_seconds`` (at most ``max_steps``). A 10 ms step timed ten times
    on a shared machine moves its median by a third; a few seconds of rounds
    steady it.
    """
    torch.set_num_threads(threads)
    step = make_step(cfg.model, cfg.what, cfg.batch, cfg.K, device)
    rss0 = rss_mb()  # interpreter, libraries, model and data
    reset_peak()
    timed = _timer(device)
    for _ in range(warmup):
        timed(step)
    peak = peak_mb()
    result = {**asdict(cfg), "device": device, "threads": threads, "rss0_mb": rss0, "peak_mb": peak}
    if device.startswith("cuda"):
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    times: list[float] = []  # ms per step
    refs: list[float] = []
    ref = None if cfg.what == "nonprivate" else make_step(cfg.model, "nonprivate", cfg.batch, cfg.K, device)
    rival_what = cfg.what.replace("_ghost", "_hooks") if rival and cfg.what.endswith("_ghost") else None
    other = make_step(cfg.model, rival_what, cfg.batch, cfg.K, device) if rival_what else None
    others: list[float] = []
    for extra in [e for e in (ref, other) if e is not None]:
        for _ in range(max(1, warmup - 1)):
            timed(extra)
    started = time.perf_counter()
    while len(times) < steps or (time.perf_counter() - started < min_seconds and len(times) < max_steps):
        if ref is not None:
            refs.append(timed(ref))
        if other is not None:
            others.append(timed(other))
        times.append(timed(step))
    result.update(median_ms=statistics.median(times), min_ms=min(times), n=len(times))
    if others:
        result.update(rival=rival_what, rival_median_ms=statistics.median(others), rival_min_ms=min(others))
    result["ref_median_ms"] = statistics.median(refs) if refs else result["median_ms"]
    result["ratio"] = result["median_ms"] / result["ref_median_ms"]
    result["ratio_min"] = result["min_ms"] / (min(refs) if refs else result["min_ms"])  # less sensitive to load spikes
    return result


def run_in_subprocess(cfg: Config, *, timeout: float = 600, **kwargs: object) -> dict:
    """:func:`measure` in a fresh interpreter; an error becomes ``{"error": ...}`` in the row."""
    payload = json.dumps({"cfg": asdict(cfg), **kwargs})
    cmd = [sys.executable, "-m", "dpnotebook.benchmarks", "--child", payload]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**asdict(cfg), "error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**asdict(cfg), "error": why[:300]}
    return json.loads(lines[-1])


def child_main(payload: str) -> None:
    """Entry point of the subprocess: measure the configuration and print one JSON line."""
    args = json.loads(payload)
    cfg = Config(**args.pop("cfg"))
    print(json.dumps(measure(cfg, **args)))


__all__ = ["Config", "plan", "measure", "run_in_subprocess", "child_main", "KINDS", "DP_LAYER_MODELS"]
