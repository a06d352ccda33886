"""DP steps of dpnotebook and Opacus timed in one process, interleaved: ``python -m dpnotebook.benchmarks.side_by_side``.

``python -m dpnotebook.benchmarks`` runs each configuration in a process of its own, against its own
non-private step; on a GPU every process pays CUDA's start-up again, and the clock and the load of the
machine drift between them. Here the configurations of one (model, B) row are built in one process and
timed in turn, round after round, so whatever slows one step slows the others alike, and each ratio is
to the non-private step timed beside it. This is the table of ``docs/performance.md``, "On a GPU".

>>> rows = time_row("MLP", 4, ["nonprivate", "dpsgd_ghost"], rounds=2, warmup=1)
>>> [r.what for r in rows], rows[0].ratio
(['nonprivate', 'dpsgd_ghost'], 1.0)
>>> best_ratio(rows, "dpsgd_") > 0
True
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass

import torch

from dpnotebook.benchmarks.models import MODELS
from dpnotebook.benchmarks.steps import MODES, OPACUS_MODES, interleaved, make_step, opacus_available

__all__ = ["Timed", "time_row", "best_ratio", "DEFAULT_WHATS", "main"]

#: The configurations of a row: the reference first, then dpnotebook's and Opacus' DP-SGD steps in every
#: mode (the best of each library is compared; a mode that refuses a model stays a row with its error).
DEFAULT_WHATS = (
    "nonprivate",
    *(f"dpsgd_{mode}" for mode in MODES),
    *(f"opacus_dpsgd_{mode}" for mode in OPACUS_MODES),
)


@dataclass(frozen=True)
class Timed:
    """One configuration of a row: its median milliseconds and their ratio to the row's non-private
    step (``nan`` where it failed; ``error`` then says why)."""

    model: str
    batch: int
    what: str
    ms: float
    ratio: float
    error: str = ""


def time_row(
    name: str, batch: int, whats: list[str], *, device: str = "cpu", rounds: int = 15, warmup: int = 5
) -> list[Timed]:
    """Time ``whats`` (the first is the reference) on model ``name`` with ``batch`` samples, interleaved.

    A configuration that cannot be built or run (Opacus missing, a refusal) is kept as a row with its
    error, so one failure does not hide the others.
    """
    steps, errors = {}, {}
    for what in whats:
        try:
            step = make_step(name, what, batch, device=device)
            for _ in range(warmup):
                step()
            steps[what] = step
        except Exception as err:  # noqa: BLE001 - reported in the table
            errors[what] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    medians = {what: statistics.median(t) for what, t in interleaved(steps, rounds, device).items()}
    base = medians.get(whats[0], math.nan)
    return [
        Timed(name, batch, what, medians.get(what, math.nan), medians.get(what, math.nan) / base, errors.get(what, ""))
        for what in whats
    ]


def best_ratio(rows: list[Timed], prefix: str) -> float:
    """The smallest ratio among the rows whose configuration starts with ``prefix`` (``nan`` if none ran)."""
    ratios = [r.ratio for r in rows if r.what.startswith(prefix) and not math.isnan(r.ratio)]
    return min(ratios, default=math.nan)


def _line(rows: list[Timed]) -> str:
    cells = [f"{rows[0].model} B={rows[0].batch}: {rows[0].what} {rows[0].ms:.2f} ms"]
    cells += [f"{r.what} {r.ms:.2f} ({r.ratio:.2f}x)" if not r.error else f"{r.what} {r.error}" for r in rows[1:]]
    dpn, opacus = best_ratio(rows, "dpsgd_"), best_ratio(rows, "opacus_")
    if not math.isnan(dpn) and not math.isnan(opacus):
        cells.append(f"best dpnotebook / best Opacus {dpn / opacus:.2f}")
    return " | ".join(cells)


def main(argv: list[str] | None = None) -> list[Timed]:
    """Parse the command line, time each (model, B) row, print one line per row; returns every row."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["SampleConvNet", "SmallResNetGN"], choices=sorted(MODELS))
    parser.add_argument("--batch", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--whats", nargs="+", default=list(DEFAULT_WHATS), help="configurations, reference first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="write every row as JSON")
    args = parser.parse_args(argv)
    whats = [w for w in args.whats if not w.startswith("opacus_") or opacus_available() is not None]
    print(f"device {args.device}; medians of {args.rounds} interleaved rounds, ms (x the first configuration)")
    every: list[Timed] = []
    for name in args.models:
        for batch in args.batch:
            rows = time_row(name, batch, whats, device=args.device, rounds=args.rounds, warmup=args.warmup)
            print(_line(rows), flush=True)
            every += rows
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rows": [asdict(r) for r in every]}, f, indent=1)
    return every


if __name__ == "__main__":
    main()
