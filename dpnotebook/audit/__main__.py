"""``python -m dpnotebook.audit``: run the adversarial sensitivity grid and print a summary per mode.

Options: ``--float32`` audits in float32 (default float64), ``--mode NAME`` and
``--family NAME`` (repeatable) restrict the grid, ``--show`` lists every point
that does not keep the library's promise.
"""

from __future__ import annotations

import argparse
import time

import torch

from dpnotebook.audit.grid import grid, matches, run_point
from dpnotebook.audit.summary import summarise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpnotebook.audit", description=__doc__.splitlines()[0])
    parser.add_argument("--float32", action="store_true", help="audit in float32 (default: float64)")
    parser.add_argument("--mode", action="append", help="audit only this mode (repeatable)")
    parser.add_argument("--family", action="append", help="audit only this layer family (repeatable)")
    parser.add_argument("--show", action="store_true", help="print every point that breaks the promise")
    args = parser.parse_args(argv)
    dtype = torch.float32 if args.float32 else torch.float64
    start = time.perf_counter()
    outcomes = [run_point(p) for p in grid(modes=args.mode, families=args.family, dtype=dtype)]
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
