"""Plots of an attacker against the Gaussian mechanism, and of real attacks, usable without widgets.

>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> x = np.linspace(-3, 4, 50)
>>> art = draw_densities(ax, x, np.exp(-x**2 / 2), np.exp(-(x - 1)**2 / 2), threshold=0.5)
>>> update_densities(art, x, np.exp(-x**2 / 2), np.exp(-(x - 1)**2 / 2), threshold=1.0)
>>> art.threshold.get_xdata()
[1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D

__all__ = [
    "DensityArtists",
    "draw_densities",
    "update_densities",
    "TradeoffArtists",
    "draw_tradeoff",
    "update_tradeoff",
    "RocArtists",
    "draw_rocs",
    "update_rocs",
]


@dataclass
class DensityArtists:
    """The two output densities, the threshold, and the areas above it (FPR and TPR)."""

    ax: Axes
    out_line: Line2D
    in_line: Line2D
    threshold: Line2D
    fpr_area: PolyCollection
    tpr_area: PolyCollection


def _area(x: np.ndarray, y: np.ndarray, threshold: float) -> np.ndarray:
    keep = x >= threshold
    xs, ys = x[keep], y[keep]
    if xs.size == 0:
        return np.zeros((0, 2))
    return np.concatenate([[[xs[0], 0.0]], np.column_stack([xs, ys]), [[xs[-1], 0.0]]])


def draw_densities(
    ax: Axes, x: np.ndarray, density_out: np.ndarray, density_in: np.ndarray, *, threshold: float
) -> DensityArtists:
    """The output's density without (``D``, blue) and with (``D'``, red) the record; shaded: where the
    attacker says 'in' (the blue area is the FPR, the red one the TPR)."""
    (out_line,) = ax.plot([], [], color="C0", label="without the record (D)")
    (in_line,) = ax.plot([], [], color="C3", label="with it (D')")
    areas = [PolyCollection([], color=color, alpha=0.25, lw=0) for color in ("C0", "C3")]
    for area in areas:
        ax.add_collection(area)
    threshold_line = ax.axvline(threshold, color="k", ls="--", lw=1)
    ax.set_xlabel("mechanism output")
    ax.set_ylabel("density")
    art = DensityArtists(ax, out_line, in_line, threshold_line, *areas)
    update_densities(art, x, density_out, density_in, threshold=threshold)
    return art


def update_densities(
    art: DensityArtists, x: np.ndarray, density_out: np.ndarray, density_in: np.ndarray, *, threshold: float
) -> None:
    """New densities and threshold; rescale the axes."""
    art.out_line.set_data(x, density_out)
    art.in_line.set_data(x, density_in)
    art.threshold.set_xdata([threshold, threshold])
    art.fpr_area.set_verts([_area(x, density_out, threshold)])
    art.tpr_area.set_verts([_area(x, density_in, threshold)])
    art.ax.set_xlim(x[0], x[-1])
    art.ax.set_ylim(0, 1.15 * max(float(density_out.max()), float(density_in.max())))


@dataclass
class TradeoffArtists:
    """The trade-off curve, its (epsilon, delta) bound and the attacker's point."""

    ax: Axes
    curve: Line2D
    bound: Line2D
    point: Line2D


def draw_tradeoff(
    ax: Axes, fpr: np.ndarray, curve: np.ndarray, bound: np.ndarray, *, point: tuple[float, float]
) -> TradeoffArtists:
    """TPR against FPR: the best attacks (green curve), what (epsilon, delta) allows (dashed), this attack (dot)."""
    ax.plot([0, 1], [0, 1], color="0.8", lw=1)
    (curve_line,) = ax.plot(fpr, curve, color="C2", label="best attacks (trade-off curve)")
    (bound_line,) = ax.plot(fpr, bound, color="k", ls="--", lw=1, label="(eps, delta) bound")
    (point_line,) = ax.plot([point[0]], [point[1]], "o", color="C3", ms=8, label="this threshold")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    return TradeoffArtists(ax, curve_line, bound_line, point_line)


def update_tradeoff(
    art: TradeoffArtists, fpr: np.ndarray, curve: np.ndarray, bound: np.ndarray, *, point: tuple[float, float]
) -> None:
    """New curve, bound and point."""
    art.curve.set_data(fpr, curve)
    art.bound.set_data(fpr, bound)
    art.point.set_data([point[0]], [point[1]])


@dataclass
class RocArtists:
    """One ROC line per attack, the selected attack's (epsilon, delta) bound and exact trade-off curve."""

    ax: Axes
    lines: dict[str, Line2D]
    bound: Line2D
    curve: Line2D


def _floored(values: np.ndarray | None, like: np.ndarray, floor: float) -> np.ndarray:
    return np.full_like(like, np.nan) if values is None else np.maximum(values, floor)


def draw_rocs(
    ax: Axes,
    rocs: Mapping[str, tuple[np.ndarray, np.ndarray]],
    fpr_grid: np.ndarray,
    bound: np.ndarray | None,
    *,
    selected: str,
    curve: np.ndarray | None = None,
    floor: float = 1e-3,
) -> RocArtists:
    """Real attacks' ROC curves on log-log axes (low FPR is where an attack matters): the selected one
    red, the others grey, with the bound of its model's epsilon (dashed) and its target's exact trade-off
    curve if known (green). Rates below ``floor`` are drawn at it. No legend (text is costly to redraw)."""
    ax.plot([floor, 1], [floor, 1], color="0.8", lw=1)
    lines = {}
    for label, (fpr, tpr) in rocs.items():
        (lines[label],) = ax.plot(_floored(fpr, fpr, floor), _floored(tpr, tpr, floor), label=label, ds="steps-post")
    (bound_line,) = ax.plot([], [], color="k", ls="--", lw=1)
    (curve_line,) = ax.plot([], [], color="C2", lw=1.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1.05)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    art = RocArtists(ax, lines, bound_line, curve_line)
    update_rocs(art, fpr_grid, bound, selected=selected, curve=curve, floor=floor)
    return art


def update_rocs(
    art: RocArtists,
    fpr_grid: np.ndarray,
    bound: np.ndarray | None,
    *,
    selected: str,
    curve: np.ndarray | None = None,
    floor: float = 1e-3,
) -> None:
    """Colour and thicken the selected attack's line, grey the others, and draw its bound and curve."""
    for label, line in art.lines.items():
        on = label == selected
        line.set(linewidth=2.5 if on else 1.0, color="C3" if on else "0.6", zorder=3 if on else 2)
    art.bound.set_data(fpr_grid, _floored(bound, fpr_grid, floor))
    art.curve.set_data(fpr_grid, _floored(curve, fpr_grid, floor))
