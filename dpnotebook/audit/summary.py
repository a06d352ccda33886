"""A per-mode summary of audited grid points: how many kept the bound, how many were refused, the worst ratio.

>>> from dpnotebook.audit.grid import grid, run_point
>>> outcomes = [run_point(p) for p in grid(modes=["hooks"], families=["mlp"], records=["gaussian"])]
>>> print(summarise(outcomes))                      # doctest: +ELLIPSIS
mode       points  bounded  refused  broken  largest ||S(D) - S(D\\{s})|| / C
hooks          12       12        0       0  1.000000
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from dpnotebook.audit.grid import Outcome, matches

__all__ = ["summarise"]


def summarise(outcomes: Iterable[Outcome]) -> str:
    """One line per mode: points, bounded, refused (by design or not), broken (see :func:`~dpnotebook.audit.grid.matches`), worst ratio."""
    rows: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for o in outcomes:
        row = rows[o.point.mode]
        row[0] += 1
        row[1] += o.status == "bounded"
        row[2] += o.status == "refused"
        row[3] += matches(o) is not None
        if o.report is not None:
            row[4] = max(row[4], o.report.max_ratio)
    lines = [f"{'mode':<9} {'points':>7}  bounded  refused  broken  largest ||S(D) - S(D\\{{s}})|| / C"]
    for mode, (n, bounded, refused, broken, worst) in sorted(rows.items()):
        lines.append(f"{mode:<9} {n:>7} {bounded:>8} {refused:>8} {broken:>7}  {worst:.6f}")
    return "\n".join(lines)
