"""Checks of tutorial 03 (clipping): the smallest bound C in a grid that clips at most a given fraction,
against :func:`dpnotebook.widgets.clipping_stats` on the notebook's gradients and generated ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from dpnotebook.exercises._core import ExerciseFailed, register_check, require

GRID = [round(0.01 * 1.25**i, 4) for i in range(50)]


def _fraction(grads: Mapping[str, Tensor], C: float) -> float:
    from dpnotebook.widgets import clipping_stats

    return clipping_stats(grads, C).fraction_clipped


def _generated() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(3)
    scale = torch.rand(40, 1, generator=g) * 5
    return {"weight": torch.randn(40, 6, generator=g) * scale, "bias": torch.randn(40, 2, generator=g) * scale}


@register_check(
    "03.clipping_bound",
    todo="write smallest_bound(grads, grid, max_fraction): go through the grid "
    "from small to large and return the first C that clips at most max_fraction of the samples",
)
def check_clipping_bound(smallest_bound: Callable[..., Any], grads: Mapping[str, Tensor] | None) -> str:
    """The student's search against ``clipping_stats`` on every C of the grid."""
    cases: list[tuple[Mapping[str, Tensor], float]] = [(_generated(), f) for f in (0.5, 0.1, 0.9)]
    if grads is not None:
        cases.insert(0, (grads, 0.5))
    for batch, max_fraction in cases:
        fractions = [_fraction(batch, C) for C in GRID]
        want = GRID[next(i for i, f in enumerate(fractions) if f <= max_fraction)]
        got = smallest_bound(batch, list(GRID), max_fraction)
        require(got in GRID, f"smallest_bound returned {got!r}, which is not in the grid: return one of its values")
        clipped = fractions[GRID.index(got)]
        if clipped > max_fraction:
            raise ExerciseFailed(
                f"C = {got} clips {clipped:.0%} of the samples, more than {max_fraction:.0%}: "
                "'at most' means fraction_clipped <= max_fraction"
            )
        if got != want:
            raise ExerciseFailed(
                f"C = {got} clips at most {max_fraction:.0%}, but C = {want} in the grid does too: return the smallest"
            )
    return "the smallest C clipping at most the fraction asked, on the notebook's gradients and on generated ones"
