"""``python -m dpnotebook.benchmarks``: DP-SGD against the non-private step (and Opacus), every mode.

Each configuration (model, B, K, what: :mod:`~dpnotebook.benchmarks.steps`) runs in a fresh subprocess
(its peak memory is its own), its steps timed alternately with the non-private step on the same rows:
its ratio divides by that reference, timed in its own process (``docs/performance.md``). With
``--grouped`` (the default on CUDA, where each process start costs seconds) the configurations of one
model, B and K share a process and are timed round by round (:func:`measure_group`); ``--gpu
--compare-opacus`` is the GPU table of ``docs/performance.md``, every mode of both libraries.

>>> [c.what for c in plan(["MLP"], [8], modes=["ghost"], kinds=["dpsgd"], ks=[1])]
['nonprivate', 'dpsgd_ghost']
>>> [c.what for c in plan(["MLP"], [8], modes=["ghost"], kinds=["dpsgd"], compiled=True)]
['nonprivate', 'dpsgd_ghost', 'compiled_nonprivate', 'compiled_dpsgd_ghost']
>>> rows = [{"model": "MLP", "batch": 8, "K": 1, "what": "dpsgd_ghost", "median_ms": 169.6, "min_ms": 160.0,
...          "ref_median_ms": 73.1, "ratio": 2.32, "ratio_min": 2.3, "peak_mb": 300.0, "rss0_mb": 290.0, "n": 10}]
>>> print(results_table(rows).splitlines()[2])
| MLP | 8 | 1 | dpsgd_ghost | 169.6 | 160.0 | 73.1 | ×2.32 | ×2.30 | 300 | 10 | 10 |  |
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dpnotebook.benchmarks.memory import peak_mb, reset_peak, rss_mb
from dpnotebook.benchmarks.models import MODELS, TRANSFORMER_MODELS
from dpnotebook.benchmarks.profile_ops import PROFILE_BATCH, profile_table
from dpnotebook.benchmarks.steps import MODES, OPACUS_MODES, interleaved, make_step, timer

Row = dict[str, Any]
Key = tuple[str, int, int, str]  # model, B, K, what

# ---------------------------------------------------------------- the suite: plan and measure

#: Models whose DP flavour swaps in dpnotebook's DP layers (a second non-private row).
DP_LAYER_MODELS = ("TextTransformer", "LSTMClassifier")
KINDS = ("gsm", "dpsgd", "naive", "graphed")
#: The kinds a run takes unless ``--kinds`` says (``graphed``, GraphedStep's step, is asked for: ``--gpu`` does).
DEFAULT_KINDS = ("gsm", "dpsgd", "naive")
#: The modes of the ``graphed`` kind (the fast modes; a graph of the others was never measured).
GRAPHED_MODES = ("hooks", "ghost")


@dataclass(frozen=True)
class Config:
    """One row of the results: ``what`` on ``model`` with B samples of K rows."""

    model: str
    batch: int
    K: int
    what: str


def plan(
    models: Iterable[str],
    batches: Iterable[int],
    *,
    modes: Iterable[str] = MODES,
    kinds: Iterable[str] = DEFAULT_KINDS,
    ks: Iterable[int] = (1,),
    k_batch: int = 32,
    k_modes: Iterable[str] = ("hooks", "ghost"),
    opacus: bool = False,
    compiled: bool = False,
) -> list[Config]:
    """The configurations to run, in order.

    Args:
        models, batches: the grid for K=1.
        modes: dpnotebook grad-sample modes.
        kinds: ``"gsm"`` (per-sample gradients only), ``"dpsgd"``, ``"naive"`` (microbatching), ``"graphed"``
            (the DP-SGD step of :class:`~dpnotebook.privacy.GraphedStep`, in :data:`GRAPHED_MODES`).
        ks, k_batch, k_modes: each K > 1 runs at B=``k_batch`` in ``k_modes``.
        opacus: add Opacus' configurations (K=1).
        compiled: add the non-private and DP-SGD steps with the model compiled first (K=1).
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
            whats += [f"graphed_{mode}" for mode in modes if mode in GRAPHED_MODES] if "graphed" in kinds else []
            whats += ["naive_microbatch"] if "naive" in kinds else []
            if compiled:
                whats += ["compiled_nonprivate"] + [f"compiled_dpsgd_{mode}" for mode in modes if "dpsgd" in kinds]
            out += [Config(m, B, 1, w) for w in whats]
        for K in ks if any(k > 1 for k in ks) else []:
            if K == 1 and k_batch in batches:
                continue
            whats = ["nonprivate"] + [
                f"{kind}_{mode}" for kind in ("gsm", "dpsgd") if kind in kinds for mode in k_modes
            ]
            out += [Config(m, k_batch, K, w) for w in whats]
    return out


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
) -> Row:
    """Run one configuration in this process: its time, its ratio to the non-private step, its memory.

    ``peak_mb - rss0_mb`` is what the step itself needs (peak of the warm-up steps over the memory once
    built). Then rounds of one reference step and one step: at least ``steps``, and more until they took
    ``min_seconds`` (at most ``max_steps``). With ``rival``, a ghost configuration also times hooks mode
    in each round (``rival_median_ms``, ``rival_min_ms``).
    """
    torch.set_num_threads(threads)
    step = make_step(cfg.model, cfg.what, cfg.batch, cfg.K, device)
    rss0 = rss_mb()  # interpreter, libraries, model and data
    reset_peak()
    timed = timer(device)
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


def measure_group(
    cfgs: list[Config],
    *,
    steps: int = 10,
    warmup: int = 3,
    device: str = "cpu",
    threads: int = 2,
    **unused: object,
) -> list[Row]:
    """Run the configurations of one model, B and K in this process, interleaved: one row each.

    The first configuration is the reference (``nonprivate``, as :func:`plan` orders them). Each is
    built and warmed up in turn; then ``steps`` rounds take every step once
    (:func:`~dpnotebook.benchmarks.steps.interleaved`; ``min_seconds``, ``max_steps`` and ``rival`` of
    :func:`measure` are ``unused``), so whatever slows one step slows the others alike and no
    configuration pays a process start of its own (CUDA's costs seconds). Memory is the peak of each
    configuration's warm-up over what was held once it was built (on CUDA the allocator's figures,
    else the resident set): coarser than a process of its own, since memory another configuration
    freed is reused. A ghost row takes hooks' times (``rival``) from its own group. A configuration
    that cannot be built or run becomes a row with its ``error``.
    """
    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    note = "grouped, CUDA allocator MB" if cuda else "grouped"
    steps_of, rows = {}, {}
    for cfg in cfgs:
        rows[cfg.what] = row = {**asdict(cfg), "device": device, "threads": threads, "note": note}
        try:
            step = make_step(cfg.model, cfg.what, cfg.batch, cfg.K, device)
            row["rss0_mb"] = _restart_peak(cuda)
            for _ in range(warmup):
                step()
            row["peak_mb"] = _peak(cuda)
            steps_of[cfg.what] = step
        except Exception as err:  # noqa: BLE001 - reported in the table
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:240]}"
    times = interleaved(steps_of, steps, device)
    ref = times.get(cfgs[0].what, [math.nan])
    for what, t in times.items():
        r = rows[what]
        r.update(median_ms=statistics.median(t), min_ms=min(t), n=len(t), ref_median_ms=statistics.median(ref))
        r.update(ratio=r["median_ms"] / r["ref_median_ms"], ratio_min=r["min_ms"] / min(ref))
    for what, r in rows.items():
        hooks = rows.get(what.replace("_ghost", "_hooks"), {})
        if what.endswith("_ghost") and "median_ms" in hooks and "median_ms" in r:
            r.update(rival=hooks["what"], rival_median_ms=hooks["median_ms"], rival_min_ms=hooks["min_ms"])
    return [rows[cfg.what] for cfg in cfgs]


def _restart_peak(cuda: bool) -> float:
    """Restart the peak; the MB held now (the CUDA allocator's, else the process's resident set)."""
    if not cuda:
        held = rss_mb()
        reset_peak()
        return held
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated() / 2**20


def _peak(cuda: bool) -> float:
    """The peak MB since :func:`_restart_peak`."""
    if cuda:
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_mb()


def groups(configs: Iterable[Config]) -> list[list[Config]]:
    """The configurations grouped by model, B and K, in their order (each group starts with its reference).

    >>> [[c.what for c in g] for g in groups(plan(["MLP"], [2, 4], modes=["ghost"], kinds=["dpsgd"], ks=[1]))]
    [['nonprivate', 'dpsgd_ghost'], ['nonprivate', 'dpsgd_ghost']]
    """
    out: dict[tuple[str, int, int], list[Config]] = {}
    for cfg in configs:
        out.setdefault((cfg.model, cfg.batch, cfg.K), []).append(cfg)
    return list(out.values())


def run_in_subprocess(cfg: Config, *, timeout: float = 600, tree: Path | None = None, **kwargs: object) -> Row:
    """:func:`measure` in a fresh interpreter (in ``tree``, another revision's checkout, when given);
    an error becomes ``{"error": ...}`` in the row."""
    return run_group_in_subprocess([cfg], timeout=timeout, tree=tree, grouped=False, **kwargs)[0]


def run_group_in_subprocess(
    cfgs: list[Config], *, timeout: float = 600, tree: Path | None = None, grouped: bool = True, **kwargs: object
) -> list[Row]:
    """:func:`measure_group` (or, with ``grouped=False``, :func:`measure` of the one configuration) in a fresh
    interpreter; ``timeout`` is per configuration. An error becomes ``{"error": ...}`` in every row."""
    # one configuration keeps the payload of every earlier revision (``revisions`` runs their children)
    payload = {"cfgs": [asdict(c) for c in cfgs], **kwargs} if grouped else {"cfg": asdict(cfgs[0]), **kwargs}
    cmd = [sys.executable, "-m", "dpnotebook.benchmarks", "--child", json.dumps(payload)]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    limit = timeout * len(cfgs)
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return [{**asdict(cfg), "error": f"timed out after {limit:.0f} s"} for cfg in cfgs]
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return [{**asdict(cfg), "error": why} for cfg in cfgs]
    found = json.loads(lines[-1])
    return [dict(r) for r in found] if isinstance(found, list) else [dict(found)]


def child_main(payload: str) -> None:
    """Entry point of the subprocess: measure the configuration(s) and print one JSON line."""
    args = json.loads(payload)
    if "cfgs" in args:
        print(json.dumps(measure_group([Config(**c) for c in args.pop("cfgs")], **args)))
    else:
        print(json.dumps(measure(Config(**args.pop("cfg")), **args)))


# ---------------------------------------------------------------- the tables


def _f(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def results_table(rows: Iterable[Row]) -> str:
    """Markdown table: one line per configuration; ratio = time / the non-private step timed in the same process."""
    lines = [
        "| model | B | K | config | median ms | min ms | non-private ref. median ms (same process) | "
        "ratio to the ref. (medians) | ratio (minima) | peak RSS MB | Δ RSS MB | n | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['K']} | {r['what']} | ERROR | | | | | | | | {r['error'][:120]} |"
            )
            continue
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['K']} | {r['what']} | {_f(r['median_ms'])} | {_f(r['min_ms'])} | "
            f"{_f(r.get('ref_median_ms'))} | ×{_f(r['ratio'], 2)} | ×{_f(r.get('ratio_min'), 2)} | "
            f"{r['peak_mb']:.0f} | {_own(r):.0f} | {r['n']} | {r.get('note', '')} |"
        )
    lines.append(
        "\nEach ratio divides by the non-private step timed in the same process, interleaved with the row's "
        "own steps (the reference column), not by the `nonprivate` row, which ran in another process."
    )
    return "\n".join(lines)


def _own(r: Row) -> float:
    return r["peak_mb"] - r["rss0_mb"]


def _index(rows: Iterable[Row]) -> dict[Key, Row]:
    return {(r["model"], r["batch"], r["K"], r["what"]): r for r in rows if "error" not in r}


def _best(index: dict[Key, Row], key: tuple[str, int, int], prefix: str) -> tuple[str, float] | None:
    found = [(w, r["ratio"]) for (m, b, k, w), r in index.items() if (m, b, k) == key and w.startswith(prefix)]
    return min(found, key=lambda t: t[1]) if found else None


def opacus_table(rows: Iterable[Row]) -> str:
    """dpnotebook against Opacus for each model and B: ratios to the same non-private step, and their quotient."""
    index = _index(rows)
    keys = sorted({(m, b, k) for (m, b, k, w) in index if w.startswith("opacus_")})
    lines = [
        "| model | B | what | dpnotebook (ratio) | Opacus (ratio) | dpnotebook / Opacus |",
        "|---|---|---|---|---|---|",
    ]
    for key in keys:
        pairs = [
            ("DP-SGD step, best mode each", _best(index, key, "dpsgd_"), _best(index, key, "opacus_dpsgd_")),
            ("GraphedStep, best mode", _best(index, key, "graphed_"), _best(index, key, "opacus_dpsgd_")),
            ("per-sample grads, hooks", _best(index, key, "gsm_hooks"), _best(index, key, "opacus_gsm_hooks")),
            ("DP-SGD step, hooks", _best(index, key, "dpsgd_hooks"), _best(index, key, "opacus_dpsgd_hooks")),
        ]
        for label, ours, theirs in pairs:
            if ours and theirs:
                lines.append(
                    f"| {key[0]} | {key[1]} | {label} | {ours[0]} ({ours[1]:.2f}) | "
                    f"{theirs[0].removeprefix('opacus_')} ({theirs[1]:.2f}) | {ours[1] / theirs[1]:.2f} |"
                )
    return "\n".join(lines)


def multiplicity_table(rows: Iterable[Row]) -> str:
    """For each K: the step ratio and per-sample-gradient memory (the step's own peak minus the non-private step's)."""
    index = _index(rows)
    lines = [
        "| model | B | K | config | step / non-private on B*K rows | per-sample-grad MB | vs K=1 |",
        "|---|---|---|---|---|---|---|",
    ]
    ks = sorted({(m, b, k) for (m, b, k, w) in index})
    for m, b, k in ks:
        if not any(kk > 1 for (mm, bb, kk) in ks if (mm, bb) == (m, b)):
            continue
        base = index.get((m, b, k, "nonprivate"))
        for (mm, bb, kk, w), r in index.items():
            if (mm, bb, kk) != (m, b, k) or w == "nonprivate" or w.startswith(("opacus", "naive", "nonprivate")):
                continue
            psg = _own(r) - _own(base) if base else None
            one, base1 = index.get((m, b, 1, w)), index.get((m, b, 1, "nonprivate"))
            psg1 = _own(one) - _own(base1) if one and base1 else None
            rel = psg / psg1 if psg is not None and psg1 and psg1 > 0 else None
            lines.append(f"| {m} | {b} | {k} | {w} | {r['ratio']:.2f} | {_f(psg)} | {_f(rel, 2)} |")
    return "\n".join(lines)


def ghost_hooks_table(rows: Iterable[Row], kind: str = "dpsgd") -> str:
    """Ghost and hooks mode side by side for each model, B and K: times, ratios to the non-private step,
    ghost's ratio over hooks' (medians, minima, and with ``--rival`` in the ghost row's own process).

    >>> rows = [{"model": "M", "batch": 8, "K": 1, "what": w, "median_ms": t, "min_ms": t, "ratio": r,
    ...          "ratio_min": r, "ref_median_ms": 10.0} for w, t, r in [("dpsgd_hooks", 20.0, 2.0),
    ...                                                             ("dpsgd_ghost", 15.0, 1.5)]]
    >>> print(ghost_hooks_table(rows).splitlines()[2])
    | M | 8 | 1 | 20.0 (×2.00) | 15.0 (×1.50) | 0.75 | 0.75 |  |
    """
    index = _index(rows)
    lines = [
        "| model | B | K | hooks ms (× non-private) | ghost ms (× non-private) | ghost / hooks (medians) | "
        "ghost / hooks (minima) | ghost / hooks (same process, medians) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, b, k in sorted({(m, b, k) for (m, b, k, w) in index}):
        hooks, ghost = index.get((m, b, k, f"{kind}_hooks")), index.get((m, b, k, f"{kind}_ghost"))
        if hooks is None or ghost is None:
            continue
        mins = [g.get("ratio_min") for g in (ghost, hooks)]
        by_min = _f(mins[0] / mins[1], 2) if mins[0] is not None and mins[1] else ""
        same = _f(ghost["median_ms"] / ghost["rival_median_ms"], 2) if ghost.get("rival_median_ms") else ""
        lines.append(
            f"| {m} | {b} | {k} | {_f(hooks['median_ms'])} (×{_f(hooks['ratio'], 2)}) | "
            f"{_f(ghost['median_ms'])} (×{_f(ghost['ratio'], 2)}) | {ghost['ratio'] / hooks['ratio']:.2f} | "
            f"{by_min} | {same} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the command line

#: ``--quick``: every model at B=128, hooks and ghost, K in {1, 16} on SampleConvNet.
QUICK = {
    "models": list(MODELS),
    "batch": [128],
    "modes": ["hooks", "ghost"],
    "kinds": list(KINDS),
    "ks": [1, 16],
    "k_models": ["SampleConvNet"],
}
#: ``--transformers``: the Hugging Face transformers and the text transformer, ghost against hooks, one thread.
TRANSFORMERS = {
    "models": [*TRANSFORMER_MODELS, "TextTransformer"],
    "batch": [32],
    "modes": ["hooks", "ghost"],
    "kinds": ["dpsgd"],
    "ks": [1],
    "threads": 1,
    "rival": True,
}
#: ``--gpu``: the table of ``docs/performance.md`` "On a GPU": every suite model at B = 512 and 2048, DP-SGD
#: in every mode of both libraries (with ``--compare-opacus``), K = 1, each (model, B) in one process.
GPU = {
    "models": list(MODELS),
    "batch": [512, 2048],
    "kinds": ["dpsgd", "graphed"],
    "ks": [1],
    "steps": 15,
    "warmup": 5,
    "min_seconds": 0.0,
    "grouped": True,
}
#: The options :func:`measure` takes, passed on to each configuration's process.
SETTINGS = ("steps", "warmup", "threads", "device", "min_seconds", "max_steps", "rival")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite's options (``--help``); bad values are refused with the fix."""
    p = argparse.ArgumentParser(prog="python -m dpnotebook.benchmarks", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--models", nargs="+", choices=sorted({*MODELS, *TRANSFORMER_MODELS}), default=list(MODELS))
    add("--batch", nargs="+", type=int, default=[32, 128], help="samples per batch B (default 32 128)")
    add("--modes", nargs="+", choices=MODES, default=list(MODES))
    add(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=list(DEFAULT_KINDS),
        help="gsm: per-sample grads; naive: microbatching; graphed: GraphedStep's DP-SGD step (hooks, ghost)",
    )
    add("--ks", nargs="+", type=int, default=[1, 4, 16], help="augmentation multiplicities K (default 1 4 16)")
    add("--k-batch", type=int, default=32, help="B of the K > 1 configurations (default 32)")
    add("--k-models", nargs="+", choices=sorted(MODELS), help="models of the K > 1 configurations (default --models)")
    add("--k-modes", nargs="+", choices=MODES, default=["hooks", "ghost"])
    add("--steps", type=int, default=10, help="timed steps per configuration, at least (default 10)")
    add("--min-seconds", type=float, default=2.0, help="then time until this long has passed (default 2.0)")
    add("--max-steps", type=int, default=200, help="... but at most this many steps (default 200)")
    add("--warmup", type=int, default=3)
    add("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--timeout", type=float, default=600, help="seconds per configuration")
    add("--compare-opacus", action="store_true", help="also run Opacus 1.6 on the same models (K=1)")
    add("--compile", action="store_true", help="also time the steps with the model torch.compile'd (CUDA: graphs)")
    add("--quick", action="store_true", help="preset: every model at B=128, hooks and ghost, K in {1,16}")
    add("--transformers", action="store_true", help="preset: Hugging Face models, ghost vs hooks, B=32, --rival")
    add("--profile-ops", action="store_true", help="count the aten ops of one DP step, every mode, and Opacus'")
    add("--profile-batch", type=int, default=PROFILE_BATCH, help="B of --profile-ops (default 16)")
    add("--gpu", action="store_true", help="preset: suite models, B=512 2048, DP-SGD, every mode, K=1")
    add(
        "--grouped",
        action=argparse.BooleanOptionalAction,
        help="time each (model, B, K) group in one process, interleaved (default: on for CUDA, off for the CPU)",
    )
    add("--rival", action="store_true", help="ghost configurations also time hooks mode in the same process")
    add("--json", metavar="PATH", help="write all rows and the settings as JSON")
    add("--report", metavar="PATH", help="print the tables of an earlier --json file and exit")
    add("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for preset, values in ((args.quick, QUICK), (args.transformers, TRANSFORMERS), (args.gpu, GPU)):
        if preset:  # a preset's values become defaults: an option given beside it still wins
            p.set_defaults(**values)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps={args.steps} and --warmup={args.warmup}: use --steps >= 1 and --warmup >= 0.")
    if args.min_seconds < 0 or args.max_steps < args.steps:
        p.error(
            f"--min-seconds={args.min_seconds} and --max-steps={args.max_steps}: use --min-seconds >= 0 "
            f"and --max-steps >= --steps ({args.steps})."
        )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device={args.device} but CUDA is not available here; use --device cpu.")
    return args


def configurations(args: argparse.Namespace) -> list[Config]:
    """The configurations of the parsed options: the K=1 grid, then the K > 1 configurations."""
    configs = plan(
        args.models,
        args.batch,
        modes=args.modes,
        kinds=args.kinds,
        ks=[],
        opacus=args.compare_opacus,
        compiled=args.compile,
    )
    k_plan = {"ks": args.ks, "k_batch": args.k_batch, "k_modes": args.k_modes}
    return configs + plan(args.k_models or args.models, [], modes=args.modes, kinds=args.kinds, **k_plan)


def environment() -> Row:
    """torch's and Python's versions and the machine, for a JSON file's settings."""
    return {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}


def print_tables(rows: list[Row]) -> None:
    """The results table, then (where the rows hold them) against Opacus, the cost of K, ghost against hooks."""
    print(results_table(rows))
    whats = {r["what"] for r in rows}
    if any(w.startswith("opacus_") for w in whats):
        print("\n" + opacus_table(rows))
    if any(r["K"] > 1 for r in rows):
        print("\n" + multiplicity_table(rows))
    if {"dpsgd_ghost", "dpsgd_hooks"} <= whats:
        print("\n" + ghost_hooks_table(rows))


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or ``--report``, ``--profile-ops``) and print its tables."""
    args = parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    if args.report:
        with open(args.report) as f:
            print_tables(json.load(f)["rows"])
        return 0
    if args.profile_ops:
        torch.set_num_threads(args.threads)
        print(f"aten operations per DP step (B={args.profile_batch}, CPU profiler; dpnotebook / Opacus 1.6)")
        print(profile_table(args.models, args.modes, batch=args.profile_batch))
        return 0
    configs = configurations(args)
    settings = {k: getattr(args, k) for k in SETTINGS}
    grouped = args.device.startswith("cuda") if args.grouped is None else args.grouped
    batches = groups(configs) if grouped else [[cfg] for cfg in configs]
    where = "each (model, B, K) in one process" if grouped else "each in its own process"
    print(f"{len(configs)} configurations, {where} ({settings})", file=sys.stderr)
    rows: list[Row] = []
    start = time.time()
    for batch in batches:
        found = run_group_in_subprocess(batch, timeout=args.timeout, grouped=grouped, **settings)
        for cfg, row in zip(batch, found, strict=True):
            rows.append(row)
            shown = row.get("error") or f"{row['median_ms']:.1f} ms, x{row['ratio']:.2f}, peak {row['peak_mb']:.0f} MB"
            print(f"[{len(rows)}/{len(configs)} {time.time() - start:.0f}s] {cfg}: {shown}", file=sys.stderr)
    print_tables(rows)
    if args.json:
        with open(args.json, "w") as f:
            settings["grouped"] = grouped
            json.dump({"settings": {**environment(), **settings}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
