"""What CUDA graphs would give a DP step: each benchmark step captured whole, replayed, and timed beside itself eager.

A maintainer's experiment for a lent GPU machine (issue #31 asks for CUDA graphs "where they pay"). On a
GPU a small model's DP step is bound by the host, so the question is how much of its time a graph, which
replays the step's kernels with no Python and no launches from the host, would take away. The answer is
an upper bound for any graphed DP step the library could offer; **this is not such a step**:

- a replayed graph runs no Python, so nothing the library does in Python (the accountant's step hook,
  the checks, the warning of the finite-norm check) runs at replay; a library step would have to count
  each replay itself;
- the capture needs the step's one host read (:func:`~dpnotebook.privacy._mechanisms.nonfinite_mask`) off:
  while ``--no-read`` is in force it answers "all finite" without reading, which is why the eager step is
  also timed that way, to show what the read alone costs;
- the batch has a fixed size; Poisson sampling would need padded batches.

For each model and configuration (:func:`~dpnotebook.benchmarks.steps.make_step`): ``eager``, ``eager
without the read`` and ``graphed`` (captured after warm-up on a side stream, as PyTorch's whole-network
capture does), timed in interleaved rounds in one process, CUDA-synchronised, the median in ms and its
ratio to the eager non-private step. A configuration whose capture fails prints the error and goes on.
After the timing each graphed model's parameters are checked finite and moved by the replays.

    python tools/graph_bound.py --batch 2048 --models SampleConvNet MLP

On the CPU it runs the eager columns only (a dry run: ``--device cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import traceback
from collections.abc import Callable, Iterator

import torch

import dpnotebook.privacy._mechanisms as dp_mechanisms
import dpnotebook.privacy._optimizer as dp_optimizer
from dpnotebook.benchmarks.steps import interleaved, make_step

CONFIGS = ["nonprivate", "dpsgd_ghost", "dpsgd_hooks", "opacus_dpsgd_hooks", "opacus_dpsgd_ew"]
#: The modules that call the check (each holds its own name for it).
_CALLERS = (dp_mechanisms, dp_optimizer)
_real_mask = dp_mechanisms.nonfinite_mask


@contextlib.contextmanager
def no_read() -> Iterator[None]:
    """The finite-norm check answers "all finite" without reading the device (the capture cannot read)."""
    for module in _CALLERS:
        setattr(module, "nonfinite_mask", lambda norms: None)  # noqa: B010 - both modules' own name for it
    try:
        yield
    finally:
        for module in _CALLERS:
            setattr(module, "nonfinite_mask", _real_mask)  # noqa: B010


def without_read(step: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with no_read():
            step()

    return run


def graphed(step: Callable[[], None], warmup: int = 3) -> Callable[[], None]:
    """``step`` captured in a CUDA graph after ``warmup`` runs on a side stream; the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), no_read():
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with no_read(), torch.cuda.graph(graph):
        step()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, nargs="+", default=[2048])
    parser.add_argument("--models", nargs="+", default=["SampleConvNet", "MLP"])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    print(f"# CUDA graphs against eager ({args.device}, torch {torch.__version__}; ms, median of {args.rounds})")
    print(
        "\n| model | B | configuration | eager | eager, no read | graphed | graphed / eager |\n|---|---|---|---|---|---|---|"
    )
    for name in args.models:
        for batch in args.batch:
            runs: dict[str, Callable[[], None]] = {}
            params: dict[str, list[torch.Tensor]] = {}
            for what in args.configs:
                try:
                    runs[f"{what}|eager"] = make_step(name, what, batch, device=args.device)
                    runs[f"{what}|noread"] = without_read(make_step(name, what, batch, device=args.device))
                    if cuda:
                        step = make_step(name, what, batch, device=args.device)
                        runs[f"{what}|graphed"] = graphed(step)
                        cells = step.__closure__ or ()
                        model = next(c.cell_contents for c in cells if isinstance(c.cell_contents, torch.nn.Module))
                        params[what] = [p.detach().clone() for p in model.parameters()]
                        params[f"{what}|live"] = list(model.parameters())
                except Exception as error:  # noqa: BLE001 - an experiment: report and go on
                    print(f"<!-- {name} B={batch} {what}: {type(error).__name__}: {error} -->")
                    traceback.print_exc(limit=3)
            times = {k: statistics.median(v) for k, v in interleaved(runs, args.rounds, args.device, warmup=2).items()}
            for what in args.configs:
                print(row(name, batch, what, times))
            for what in args.configs:
                if what in params:
                    live = params[f"{what}|live"]
                    moved = any(not torch.equal(a, b) for a, b in zip(params[what], live, strict=True))
                    finite = all(bool(torch.isfinite(p).all()) for p in live)
                    print(f"<!-- {name} B={batch} {what} graphed: parameters moved {moved}, finite {finite} -->")


if __name__ == "__main__":
    main()
