"""What CUDA graphs would give a DP step: each benchmark step captured whole, replayed, and timed beside itself eager.

A maintainer's experiment for a lent GPU machine (issue #31 asks for CUDA graphs "where they pay"). On a
GPU a small model's DP step is bound by the host, so the question is how much of its time a graph, which
replays the step's kernels with no Python and no launches from the host, would take away. The answer is
an upper bound for any graphed DP step the library could offer; **this is not such a step**:

- a replayed graph runs no Python, so nothing the library does in Python (the accountant's step hook,
  the checks, the warning of the finite-norm check) runs at replay; a library step would have to count
  each replay itself;
- the capture needs the step's host reads off: inside :func:`no_read`
  (:func:`~dpnotebook.grad_sample._engine.capturable.capturable_step`) the finite-norm check masks on
  the device at every step, as :class:`~dpnotebook.privacy.GraphedStep` does, which is why the eager step
  is also timed that way, to show what the reads alone cost;
- the batch has a fixed size; :class:`~dpnotebook.privacy.GraphedStep` is the library's step that pads
  Poisson batches to one, counts every replay and draws the noise on the host.

For each model and configuration (:func:`~dpnotebook.benchmarks.steps.make_step`), in a process of its
own: ``eager`` and ``eager without the read``, timed in interleaved rounds with the eager non-private
step, then ``graphed`` (captured after three eager warm-up steps), timed in rounds with the non-private
step again; CUDA-synchronised medians in ms, with their ratio to the non-private step. The eager row is
printed before the capture, so a capture that fails (or leaves the CUDA context unusable) still leaves it.
After the timing the graphed model's parameters are checked finite and moved by the replays.

First try (H200, 2026-11-27, every configuration in one process, warm-up on a side stream): a
device-side assert in ``nll_loss`` (a target out of range) surfaced in the hooks configuration's first
step and ended the run before any row; its cause was not found without a GPU. Second try (same day, one
process per configuration, warm-up on the default stream): every SampleConvNet row and the
TextTransformer's hooks row ran (``docs/performance.md``, "CUDA graphs: GraphedStep"); the
TextTransformer's ghost capture failed at ``capture_end`` (the message was cut before its cause), most
likely on ``torch.unique`` in the embedding norms, whose result's size is the data's: the only such call
a CPU check found in that step, and one :func:`no_read` now replaces. ``--launch-blocking`` runs each configuration with
``CUDA_LAUNCH_BLOCKING=1``, so that such an error names the operation that raised it (the timings are
then meaningless), and a failed configuration's line gives the traceback's last frames.

    python tools/graph_bound.py --batch 2048 --models SampleConvNet MLP

On the CPU it runs the eager columns only (a dry run: ``--device cpu``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

import torch

from dpnotebook.benchmarks.steps import interleaved, make_step
from dpnotebook.grad_sample._engine.capturable import capturable_step

#: The configurations timed against the eager non-private step (which every row measures beside them).
CONFIGS = ["dpsgd_ghost", "dpsgd_hooks", "opacus_dpsgd_hooks", "opacus_dpsgd_ew"]
#: The step without its host reads, as GraphedStep captures it: the finite-norm mask (and ghost mode's Gram
#: guard, the embedding norms) computed on the device for every step, nothing read.
no_read = capturable_step


def without_read(step: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with no_read():
            step()

    return run


def graphed(step: Callable[[], None], warmup: int = 3) -> Callable[[], None]:
    """``step`` captured in a CUDA graph after ``warmup`` eager runs; the graph's replay."""
    with no_read():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with no_read(), torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return graph.replay


def row(name: str, batch: int, what: str, times: dict[str, float]) -> str:
    """One table row: each column's median (× the eager non-private step) and graphed over eager.

    >>> row("MLP", 8, "dpsgd_ghost", {"nonprivate|eager": 2.0, "dpsgd_ghost|eager": 6.0, "dpsgd_ghost|graphed": 3.0})
    '| MLP | 8 | dpsgd_ghost | 6.00 (×3.00) | — | 3.00 (×1.50) | 0.50 |'
    """
    base = times.get("nonprivate|eager")

    def cell(key: str) -> str:
        t = times.get(f"{what}|{key}")
        return "—" if t is None else f"{t:.2f}" + (f" (×{t / base:.2f})" if base else "")

    g, e = times.get(f"{what}|graphed"), times.get(f"{what}|eager")
    ratio = f"{g / e:.2f}" if g and e else "—"
    return f"| {name} | {batch} | {what} | {cell('eager')} | {cell('noread')} | {cell('graphed')} | {ratio} |"


def measure(name: str, batch: int, what: str, device: str, rounds: int) -> str:
    """The table row of one configuration, timed against the eager non-private step in this process.

    Eager and eager without the read are timed first, so that a capture that fails (or kills the
    CUDA context) still leaves them printed; then the graph, again beside the non-private step."""
    base = make_step(name, "nonprivate", batch, device=device)
    runs = {
        "nonprivate|eager": base,
        f"{what}|eager": make_step(name, what, batch, device=device),
        f"{what}|noread": without_read(make_step(name, what, batch, device=device)),
    }
    times = {k: statistics.median(v) for k, v in interleaved(runs, rounds, device, warmup=2).items()}
    print(f"<!-- eager: {row(name, batch, what, times)} -->", flush=True)
    if not device.startswith("cuda"):
        return row(name, batch, what, times)
    step = make_step(name, what, batch, device=device)
    # the model the step closes over (steps._training's `model`; a loss can be a module too)
    model = dict(zip(step.__code__.co_freevars, (c.cell_contents for c in step.__closure__ or ()), strict=True))[
        "model"
    ]
    replay = graphed(step)
    before = [p.detach().clone() for p in model.parameters()]
    graph_times = interleaved({"base": base, "graphed": replay}, rounds, device, warmup=2)
    # the graph's ratio to the non-private step of its own rounds, carried over to the eager rounds' base
    times[f"{what}|graphed"] = times["nonprivate|eager"] * (
        statistics.median(graph_times["graphed"]) / statistics.median(graph_times["base"])
    )
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"<!-- graphed: parameters moved {moved}, finite {finite} -->")
    return row(name, batch, what, times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, nargs="+", default=[2048])
    parser.add_argument("--models", nargs="+", default=["SampleConvNet", "MLP"])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--launch-blocking",
        action="store_true",
        help="CUDA_LAUNCH_BLOCKING=1 in each configuration's process: an error names the operation that "
        "raised it (the timings then mean nothing)",
    )
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "B", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one configuration
        name, batch, what = args.one
        print(measure(name, int(batch), what, args.device, args.rounds))
        return
    print(f"# CUDA graphs against eager ({args.device}, torch {torch.__version__}; ms, median of {args.rounds})")
    print("\n| model | B | configuration | eager | eager, no read | graphed | graphed / eager |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for name in args.models:
        for batch in args.batch:
            for what in (w for w in args.configs if w != "nonprivate"):  # the reference of every row
                # its own process: a failed capture can leave the CUDA context unusable
                command = [sys.executable, __file__, "--device", args.device, "--rounds", str(args.rounds)]
                env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if args.launch_blocking else {})}
                one = [*command, "--one", name, str(batch), what]
                done = subprocess.run(one, capture_output=True, text=True, env=env)
                lines = done.stdout.strip().splitlines()
                if done.returncode == 0 and lines:
                    print(*(line for line in lines if line.startswith(("|", "<!-- graphed"))), sep="\n", flush=True)
                    continue
                eager = [line for line in lines if line.startswith("<!-- eager")]
                cause = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
                where = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("File ")][-3:]
                cause += "" if not where else " (" + "; ".join(where)[:600] + ")"
                print(
                    *eager, f"<!-- {name} B={batch} {what}: exit {done.returncode}: {cause} -->", sep="\n", flush=True
                )


if __name__ == "__main__":
    main()
