"""``python -m dpnotebook.audit``: run the adversarial sensitivity grid and print a summary per mode.

``--float32`` audits in float32; ``--mode`` and ``--family`` (repeatable) restrict the grid;
``--compile BACKEND`` audits each model compiled with ``torch.compile(model, backend=BACKEND)``;
``--matmul-precision`` sets ``torch.set_float32_matmul_precision`` for the run (with ``--float32``: a
user who let float32 products round to TF32, ``high``, or bfloat16, ``medium``);
``--show`` lists every point that breaks the library's promise; ``--progress`` / ``--no-progress``
force the progress bar (on stderr; default: when stderr is a terminal).
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
    p = argparse.ArgumentParser(prog="python -m dpnotebook.audit", description=__doc__.splitlines()[0])
    p.add_argument("--float32", action="store_true", help="audit in float32 (default: float64)")
    for name, what, choices in (("mode", "mode", available_modes()), ("family", "layer family", sorted(FAMILIES))):
        text = f"audit only this {what} (repeatable); one of: {', '.join(choices)}"
        p.add_argument(f"--{name}", action="append", choices=choices, metavar=name.upper(), help=text)
    backends = torch.compiler.list_backends(exclude_tags=())
    p.add_argument(
        "--compile", choices=backends, metavar="BACKEND", help="compile each model first: inductor, eager..."
    )
    p.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        default="highest",
        help="float32 matrix products as torch.set_float32_matmul_precision sets them (high: TF32, medium: bf16)",
    )
    p.add_argument("--show", action="store_true", help="print every point that breaks the promise")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="show a progress bar on stderr (default: only when stderr is a terminal)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the grid the arguments select; the exit status is 1 if any point breaks the promise."""
    args = parser().parse_args(argv)
    start = time.perf_counter()
    dtype = torch.float32 if args.float32 else torch.float64
    points = list(grid(modes=args.mode, families=args.family, dtype=dtype, matmul=args.matmul_precision))
    bar = tqdm(points, desc="audit grid", unit="point", disable=not show_progress(args.progress))
    outcomes = [run_point(p, compile_backend=args.compile) for p in bar]
    print(summarise(outcomes))
    broken = [(o, why) for o in outcomes if (why := matches(o))]
    print(f"{len(outcomes)} points in {time.perf_counter() - start:.0f} s; {len(broken)} break the promise")
    for o, why in broken if args.show else []:
        print(f"- {o.point.name}: {why}")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
