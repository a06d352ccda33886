"""One DP-SGD step on 2 processes against 1 process, on the same global batch, side by side.

The digits ``SmallCNN`` on random 8x8 images: one process steps on ``batch`` samples, each of
``world_size`` processes (gloo) on its share, the clipped sums all-reduced and the noise drawn by rank 0.
The median of ``steps`` after ``warmup``; each process has 1 thread, and the 1-process figure is also
given with ``world_size`` threads. ``python -m dpnotebook.benchmarks.distributed_step --batch 256 --steps 30``

>>> row = {"mode": "hooks", "batch": 8, "one_ms": 2.0, "one_threads_ms": 1.5, "ranks_ms": 1.0, "all_reduce_ms": 0.1}
>>> print(table([row], world_size=2).splitlines()[2])
| hooks | 8 | 2.00 | 1.50 | 1.00 | 2.00x | 0.10 |
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dpnotebook import wrap_model
from dpnotebook.models import SmallCNN
from dpnotebook.privacy._optimizer import optimizer_class

__all__ = ["measure_steps", "rank_steps", "compare", "table", "main"]


def _optimizer(model: torch.nn.Module, mode: str, batch: int, distributed: bool) -> Any:
    from dpnotebook.privacy._distributed import distributed_optimizer_class

    cls = distributed_optimizer_class(optimizer_class(mode)) if distributed else optimizer_class(mode)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    return cls(
        optimizer, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=float(batch), generator=generator
    )


def measure_steps(mode: str, rows: int, global_batch: int, *, steps: int, warmup: int, distributed: bool) -> float:
    """The median milliseconds of one DP step on ``rows`` samples (``global_batch`` over all ranks)."""
    torch.manual_seed(0)
    model = wrap_model(SmallCNN(), mode)
    optimizer = _optimizer(model, mode, global_batch, distributed)
    x, y = torch.randn(rows, 1, 8, 8), torch.randint(0, 10, (rows,))
    times = []
    for i in range(warmup + steps):
        if distributed:
            dist.barrier()  # every rank starts the step together: the slowest one sets the pace
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _all_reduce_ms(steps: int) -> float:
    buffer = torch.zeros(sum(p.numel() for p in SmallCNN().parameters()))
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def rank_steps(rank: int, world_size: int, modes: list[str], batch: int, steps: int, warmup: int) -> dict[str, float]:
    """On each rank: ``{mode: median ms}`` for its ``batch / world_size`` samples, and the bare all-reduce."""
    rows = batch // world_size + (rank < batch % world_size)
    result = {mode: measure_steps(mode, rows, batch, steps=steps, warmup=warmup, distributed=True) for mode in modes}
    result["all_reduce"] = _all_reduce_ms(steps)
    return result


def compare(
    modes: list[str], batch: int, *, steps: int = 30, warmup: int = 5, world_size: int = 2
) -> list[dict[str, Any]]:
    """One row per mode: 1 process (1 thread and ``world_size`` threads) and ``world_size`` processes."""
    from dpnotebook.privacy import run_on_ranks

    threads = torch.get_num_threads()
    rows = []
    try:
        one = {}
        for n in (1, world_size):
            torch.set_num_threads(n)
            one[n] = {m: measure_steps(m, batch, batch, steps=steps, warmup=warmup, distributed=False) for m in modes}
    finally:
        torch.set_num_threads(threads)
    outcomes = run_on_ranks(rank_steps, world_size=world_size, args=(modes, batch, steps, warmup), timeout_s=600)
    for outcome in outcomes:
        if outcome.error:
            raise RuntimeError(f"rank {outcome.rank} failed: {outcome.traceback}")
    slowest = {key: max(o.value[key] for o in outcomes) for key in [*modes, "all_reduce"]}
    for mode in modes:
        rows.append({"mode": mode, "batch": batch, "one_ms": one[1][mode], "one_threads_ms": one[world_size][mode]})
        rows[-1].update(ranks_ms=slowest[mode], all_reduce_ms=slowest["all_reduce"])
    return rows


def table(rows: list[dict[str, Any]], *, world_size: int = 2) -> str:
    """A markdown table of :func:`compare`'s rows (the slowest rank's median for the processes)."""
    lines = [
        f"| mode | global batch | 1 process, 1 thread (ms) | 1 process, {world_size} threads (ms) | "
        f"{world_size} processes (ms) | speed-up vs 1 thread | all-reduce alone (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['batch']} | {r['one_ms']:.2f} | {r['one_threads_ms']:.2f} | {r['ranks_ms']:.2f} | "
            f"{r['one_ms'] / r['ranks_ms']:.2f}x | {r['all_reduce_ms']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["hooks", "ghost"])
    parser.add_argument("--batch", type=int, default=256, help="the global batch (samples)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    rows = compare(args.modes, args.batch, steps=args.steps, warmup=args.warmup, world_size=args.world_size)
    print(table(rows, world_size=args.world_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
