"""Training curves, usable without widgets.

>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_metric(ax, "loss")
>>> update_metric(art, [1, 2, 3], [0.9, 0.6, 0.5])
>>> art.line.get_ydata().tolist()
[0.9, 0.6, 0.5]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

__all__ = ["MetricArtists", "draw_metric", "update_metric"]


@dataclass
class MetricArtists:
    """One metric's curve, its last value as a dot, and an optional horizontal target line."""

    ax: Axes
    line: Line2D
    last: Line2D
    target: Line2D | None
    unit_range: bool = False


def draw_metric(
    ax: Axes,
    title: str,
    *,
    color: str = "C0",
    target: float | None = None,
    unit_range: bool = False,
    xlabel: str = "step",
) -> MetricArtists:
    """An empty curve titled ``title``; ``unit_range`` fixes y to [0, 1]."""
    (line,) = ax.plot([], [], color=color, lw=1.5)
    (last,) = ax.plot([], [], "o", color=color, ms=5)
    tline = ax.axhline(target, color="C3", ls=":", lw=1.2) if target is not None else None
    ax.set_title(title, fontsize="small")
    ax.set_xlabel(xlabel, fontsize="small")
    if unit_range:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, 1)
    return MetricArtists(ax, line, last, tline, unit_range)


def update_metric(art: MetricArtists, steps: Sequence[float], values: Sequence[float]) -> None:
    """New data; the x range grows with the steps, the y range fits the values (and target)."""
    x, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    art.line.set_data(x, y)
    art.last.set_data(x[-1:], y[-1:])
    if not x.size:
        return
    art.ax.set_xlim(0, max(float(x[-1]), 1.0) * 1.05)
    finite = y[np.isfinite(y)]  # an epsilon of inf (no noise) is shown by the progress bar, not on the axis
    if not art.unit_range and finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        if art.target is not None:
            t = float(np.asarray(art.target.get_ydata())[0])  # matplotlib's stub says ArrayLike
            lo, hi = min(lo, t), max(hi, t)
        pad = (hi - lo) * 0.08 or max(abs(hi) * 0.1, 0.1)
        art.ax.set_ylim(lo - pad, hi + pad)
