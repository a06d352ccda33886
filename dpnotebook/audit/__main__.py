"""``python -m dpnotebook.audit``: run the adversarial sensitivity grid and print a summary per mode.

Options: ``--float32`` audits in float32 (default float64), ``--mode NAME`` and
``--family NAME`` (repeatable) restrict the grid to names from the mode registry
(:func:`dpnotebook.modes.available_modes`) and the grid's families
(:data:`dpnotebook.audit.FAMILIES`); any other name is an argparse error that
lists the valid ones. ``--show`` lists every point that does not keep the library's
promise. A progress bar (on stderr) shows while the grid runs when stderr is a terminal;
``--progress`` / ``--no-progress`` force it on or off.
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from dpnotebook.audit import FAMILIES, grid, matches, run_point, summarise
from dpnotebook.modes import available_modes
from dpnotebook.privacy._training import show_progress


def parser() -> argparse.ArgumentParser:
    """The command line; its choices are read from the mode registry and the grid's families."""
    modes, families = available_modes(), sorted(FAMILIES)
    p = argparse.ArgumentParser(prog="python -m dpnotebook.audit", description=__doc__.splitlines()[0])
    p.add_argument("--float32", action="store_true", help="audit in float32 (default: float64)")
    p.add_argument(
        "--mode",
        action="append",
        choices=modes,
        metavar="MODE",
        help=f"audit only this mode (repeatable); one of: {', '.join(modes)}",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=families,
        metavar="FAMILY",
        help=f"audit only this layer family (repeatable); one of: {', '.join(families)}",
    )
    p.add_argument("--show", action="store_true", help="print every point that breaks the promise")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: only when stderr is a terminal)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    dtype = torch.float32 if args.float32 else torch.float64
    progress = show_progress(args.progress)
    start = time.perf_counter()
    points = list(grid(modes=args.mode, families=args.family, dtype=dtype))
    outcomes = [run_point(p) for p in tqdm(points, desc="audit grid", unit="point", disable=not progress)]
    print(summarise(outcomes))
    broken = [(o, matches(o)) for o in outcomes]
    broken = [(o, why) for o, why in broken if why]
    print(f"{len(outcomes)} points in {time.perf_counter() - start:.0f} s; {len(broken)} break the promise")
    if args.show:
        for o, why in broken:
            print(f"- {o.point.name}: {why}")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
