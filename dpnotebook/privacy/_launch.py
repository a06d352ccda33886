"""Run a function on several local processes with ``torch.distributed``, bounded in time.

For tests, benchmarks and notebooks on one machine (real runs use ``torchrun``): each rank is a fresh
process on ``127.0.0.1``; its result or error comes back, and a rank still running at ``timeout_s`` is
terminated.

>>> free_port() > 0
True
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass
class RankOutcome:
    """What one rank gave back: ``value`` returned, or ``error`` (``"Type: message"``) and its ``traceback``."""

    rank: int
    value: Any = None
    error: str | None = None
    traceback: str | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    backend: str,
    args: tuple[Any, ...],
    folder: str,
    timeout_s: float,
) -> None:
    torch.set_num_threads(1)
    outcome = RankOutcome(rank)
    try:
        if backend == "nccl":  # one GPU per rank, chosen before the group starts
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        outcome.value = fn(rank, world_size, *args)
    except BaseException as error:  # noqa: BLE001 - reported to the caller, who decides
        outcome.error = f"{type(error).__name__}: {error}"
        outcome.traceback = traceback.format_exc()
    finally:
        if dist.is_initialized() and outcome.error is None:
            dist.destroy_process_group()
    torch.save(outcome, os.path.join(folder, f"rank{rank}.pt"))


def run_on_ranks(
    fn: Callable[..., Any],
    *,
    world_size: int = 2,
    args: tuple[Any, ...] = (),
    backend: str = "gloo",
    timeout_s: float = 60.0,
    collective_timeout_s: float = 30.0,
) -> list[RankOutcome]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return their outcomes by rank.

    Args:
        fn: a module-level function (pickled by name).
        world_size: how many processes.
        args: more arguments for ``fn`` (picklable).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        timeout_s: the whole run's limit.
        collective_timeout_s: the process group's timeout for one collective.

    Raises:
        TimeoutError: some rank had not finished after ``timeout_s`` (all are terminated).
        RuntimeError: a rank died without reporting (killed, out of memory).
    """
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(
            _rank_main,
            args=(fn, world_size, free_port(), backend, args, folder, collective_timeout_s),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    alive = [r for r, p in enumerate(context.processes) if p.is_alive()]
                    raise TimeoutError(f"rank(s) {alive} still running after timeout_s={timeout_s} s; all terminated.")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                process.join(5)
        outcomes = []
        for rank in range(world_size):
            path = os.path.join(folder, f"rank{rank}.pt")
            if not os.path.exists(path):
                raise RuntimeError(
                    f"rank {rank} died without reporting (exit code {context.processes[rank].exitcode})."
                )
            outcomes.append(torch.load(path, weights_only=False))
        return outcomes
