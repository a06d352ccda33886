"""Where a DP step's time goes on its device: wall time, device-busy time, launches, waits and host Python.

A maintainer's tool for a lent GPU machine (``tools/gpu-session``'s ``profile`` stage): on a GPU a small
model's DP step can be bound by the host (Python and kernel launches) rather than by the device, and
this table says by how much, for each configuration of ``dpnotebook.benchmarks.steps`` side by side:

- **wall**: the median of ``--steps`` steps, each synchronised with the device;
- **busy**: the time at least one kernel ran (the union of the kernels' intervals), per step;
- **kernels**: device kernels and copies per step; **launches**: the host's launch calls;
- **waits**: the host's calls that wait for the device (synchronisations, copies to the host);
- **aten**: host time inside top-level aten operators; **python**: the Python of dpnotebook, Opacus and
  torch's Python layers per step, from ``cProfile`` (which slows what it measures: compare, do not add).

Then, per configuration, the operators with the most host time and the Python functions with the most.
On the CPU the device columns are empty. ``python tools/host_profile.py --device cuda --batch 2048``.

>>> _union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
4.0
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import Counter
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from dpnotebook.benchmarks.profile_ops import _has_aten_ancestor  # the ops counter's own rule
from dpnotebook.benchmarks.steps import make_step

#: CUDA runtime and driver calls that start a kernel or a copy.
LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"})
#: Calls on which the host waits for the device.
WAITS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaStreamWaitEvent"}
)
#: Where the Python counted in the ``python`` column lives.
LIBRARIES = ("dpnotebook/", "opacus/", "torch/")
CONFIGS = ["nonprivate", "dpsgd_ghost", "dpsgd_hooks", "dpsgd_ew", "opacus_dpsgd_hooks", "opacus_dpsgd_ew"]


def _union(intervals: list[tuple[float, float]]) -> float:
    """The length covered by ``intervals`` (overlaps counted once)."""
    covered, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            covered += b - max(a, end)
            end = b
    return covered


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(step: Callable[[], None], device: str, steps: int, profiled: int = 5) -> dict[str, object]:
    """One configuration's row (times in ms per step) and its top operators and Python functions."""
    for _ in range(3):
        step()
    walls = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        walls.append((time.perf_counter() - start) * 1e3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(profiled):
            step()
        _sync(device)
    events = prof.events()
    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    names = Counter(e.name for e in events if e.device_type == DeviceType.CPU)
    top_level = [e for e in events if e.name.startswith("aten::") and not _has_aten_ancestor(e)]
    ops: Counter[str] = Counter()
    for e in events:
        if e.name.startswith("aten::") and e.device_type == DeviceType.CPU:
            ops[e.name] += e.self_cpu_time_total
    python = cProfile.Profile()
    python.enable()
    for _ in range(profiled):
        step()
    python.disable()
    _sync(device)
    own = {k: v for k, v in pstats.Stats(python).stats.items() if any(lib in k[0] for lib in LIBRARIES)}  # type: ignore[attr-defined]
    per = 1e3 / profiled
    return {
        "wall": statistics.median(walls),
        "busy": _union([(e.time_range.start, e.time_range.end) for e in device_events]) / 1e3 / profiled,
        "kernels": len(device_events) / profiled,
        "launches": sum(names[n] for n in LAUNCHES) / profiled,
        "waits": sum(names[n] for n in WAITS) / profiled,
        "aten": sum(e.cpu_time_total for e in top_level) / 1e3 / profiled,
        "python": sum(v[2] for v in own.values()) * per,
        "top_ops": [(n, t / 1e3 / profiled) for n, t in ops.most_common(6)],
        "top_python": sorted(
            ((f"{_short(k[0])}:{k[1]}({k[2]})", v[2] * per) for k, v in own.items()),
            key=lambda kv: -kv[1],
        )[:6],
    }


def _short(path: str) -> str:
    """``path`` from its library's folder on.

    >>> _short("/usr/lib/python3/site-packages/opacus/optimizers/optimizer.py")
    'opacus/optimizers/optimizer.py'
    """
    starts = [path.find(lib) for lib in LIBRARIES if lib in path]
    return path[min(starts) :] if starts else path


def table(models: list[str], batch: int, configs: list[str], device: str, steps: int) -> str:
    """The markdown report: one row per configuration, then each one's top operators and Python functions."""
    on_gpu = device.startswith("cuda")
    lines = [
        f"# Where the DP step's time goes ({device}, B = {batch}, ms per step; torch {torch.__version__})",
        "",
        "| model | configuration | wall | busy | kernels | launches | waits | aten (host) | python (cProfile) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    for model in models:
        for config in configs:
            try:
                row = measure(make_step(model, config, batch, device=device), device, steps)
            except Exception as error:  # noqa: BLE001 - Opacus absent, a mode refusing the model: a row, not fatal
                lines.append(f"| {model} | {config} | {type(error).__name__}: {str(error)[:80]} |||||||")
                continue
            dev = [f"{row['busy']:.2f}", f"{row['kernels']:.0f}", f"{row['launches']:.0f}", f"{row['waits']:.0f}"]
            host = [f"{row['aten']:.2f}", f"{row['python']:.2f}"]
            cells = [f"{row['wall']:.2f}", *(dev if on_gpu else ["—"] * 4), *host]
            lines.append(f"| {model} | {config} | " + " | ".join(cells) + " |")
            tops = ", ".join(f"{n[6:]} {t:.3f}" for n, t in row["top_ops"])  # type: ignore[attr-defined]
            funcs = ", ".join(f"{n} {t:.3f}" for n, t in row["top_python"])  # type: ignore[attr-defined]
            details += [f"- {model} {config}: operators (self host ms) {tops}", f"  Python (tottime ms) {funcs}"]
    return "\n".join([*lines, "", *details])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--models", nargs="+", default=["SampleConvNet", "MLP"])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    args = parser.parse_args(argv)
    print(table(args.models, args.batch, args.configs, args.device, args.steps), flush=True)


if __name__ == "__main__":
    main()
