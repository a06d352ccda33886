"""Plots of clipping, usable without widgets: each ``draw_*`` takes an Axes and data and returns
its artists; the matching ``update_*`` moves them in place.

>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_norm_histogram(ax, np.array([0.5, 1.0, 2.0, 4.0]), max_grad_norm=1.5)
>>> update_norm_histogram(art, max_grad_norm=3.0)
>>> art.c_line.get_xdata()
[3.0, 3.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, StepPatch
from matplotlib.quiver import Quiver
from matplotlib.ticker import NullFormatter

__all__ = [
    "log_bins",
    "log_histogram_axes",
    "HistogramArtists",
    "draw_norm_histogram",
    "update_norm_histogram",
    "CurveArtists",
    "draw_bias_curves",
    "update_bias_curves",
    "ArrowArtists",
    "draw_arrows",
    "update_arrows",
]


def log_bins(values: np.ndarray, num: int = 30) -> np.ndarray:
    """``num + 1`` log-spaced bin edges around the positive ``values``.

    >>> log_bins(np.array([1.0, 100.0]), num=2).round(2).tolist()
    [0.83, 10.0, 120.0]
    """
    positive = values[values > 0]
    lo, hi = (positive.min() / 1.2, positive.max() * 1.2) if positive.size else (1e-3, 1.0)
    return np.geomspace(lo, hi, num + 1)


def log_histogram_axes(ax: Axes, edges: np.ndarray, top: float, xlabel: str) -> None:
    """Log x over ``edges``, y from 0 to above ``top`` counts, labelled."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, max(top, 1) * 1.15)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples")


@dataclass
class HistogramArtists:
    """The histogram of norms, the line at C, and an optional second histogram."""

    ax: Axes
    hist: StepPatch
    c_line: Line2D
    layer_hist: StepPatch | None = None
    layer_line: Line2D | None = None


def draw_norm_histogram(
    ax: Axes, norms: np.ndarray, *, max_grad_norm: float, layer_norms: np.ndarray | None = None, bins: int = 30
) -> HistogramArtists:
    """Histogram (log x) of per-sample norms ``[B]`` with a vertical line at C; ``layer_norms``
    ``[L, B]``, if given, make a second, hidden histogram (shown for per-layer clipping)."""
    pooled = norms if layer_norms is None else np.concatenate([norms, layer_norms.ravel()])
    edges = log_bins(pooled, bins)
    counts, _ = np.histogram(norms, edges)
    hist = ax.stairs(counts, edges, fill=True, alpha=0.6, color="C0", label="sample norm")
    c_line = ax.axvline(max_grad_norm, color="C3", lw=2, label="C")
    art = HistogramArtists(ax, hist, c_line)
    top = counts.max()
    if layer_norms is not None:
        counts_l, _ = np.histogram(layer_norms.ravel(), edges)
        art.layer_hist = ax.stairs(counts_l, edges, color="C2", lw=1.5, label="layer norm", visible=False)
        art.layer_line = ax.axvline(max_grad_norm, color="C2", ls="--", lw=1.5, visible=False)
        top = max(top, counts_l.max())
    per_layer = ", green: per layer)" if layer_norms is not None else ")"
    log_histogram_axes(ax, edges, top, f"per-sample norm (red: C{per_layer}")
    return art


def update_norm_histogram(art: HistogramArtists, *, max_grad_norm: float, layer_threshold: float | None = None) -> None:
    """Move the C line; with ``layer_threshold`` show the per-layer histogram and its bound."""
    art.c_line.set_xdata([max_grad_norm, max_grad_norm])
    if art.layer_hist is not None and art.layer_line is not None:
        show = layer_threshold is not None
        art.layer_hist.set_visible(show)
        art.layer_line.set_visible(show)
        if layer_threshold is not None:
            art.layer_line.set_xdata([layer_threshold, layer_threshold])


@dataclass
class CurveArtists:
    """Bias curves against C and the marker of the current C."""

    ax: Axes
    fraction: Line2D
    cosine: Line2D
    ratio: Line2D
    c_line: Line2D


def draw_bias_curves(ax: Axes, curves: dict[str, np.ndarray], *, max_grad_norm: float) -> CurveArtists:
    """Fraction clipped, cosine(clipped mean, mean) and norm ratio against C (log x)."""
    c = curves["C"]
    (fraction,) = ax.plot(c, curves["fraction_clipped"], color="C3", label="clipped")
    (cosine,) = ax.plot(c, curves["cosine"], color="C0", label="cosine")
    (ratio,) = ax.plot(c, curves["norm_ratio"], color="C1", label="norm ratio")
    c_line = ax.axvline(max_grad_norm, color="C3", lw=2, alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlim(c[0], c[-1])
    ax.set_ylim(-0.05, 1.1)
    ax.set_xlabel("clipping bound C")
    ax.legend(loc="center right", fontsize="x-small")
    return CurveArtists(ax, fraction, cosine, ratio, c_line)


def update_bias_curves(art: CurveArtists, *, max_grad_norm: float, curves: dict[str, np.ndarray] | None = None) -> None:
    """Move the current-C marker; replace the curves' data if ``curves`` is given."""
    art.c_line.set_xdata([max_grad_norm, max_grad_norm])
    if curves is not None:
        art.fraction.set_data(curves["C"], curves["fraction_clipped"])
        art.cosine.set_data(curves["C"], curves["cosine"])
        art.ratio.set_data(curves["C"], curves["norm_ratio"])


@dataclass
class ArrowArtists:
    """2-D per-sample gradients before (faint) and after clipping, the ball, the means."""

    ax: Axes
    raw: Quiver
    clipped: Quiver
    means: Quiver
    ball: Circle


def draw_arrows(
    ax: Axes,
    vectors: np.ndarray,
    *,
    clipped: np.ndarray,
    max_grad_norm: float,
    mean: np.ndarray,
    clipped_mean: np.ndarray,
) -> ArrowArtists:
    """Per-sample gradients ``[B, 2]`` as arrows from the origin, and the clipping ball of radius C."""
    n = len(vectors)
    kw: dict[str, Any] = dict(angles="xy", scale_units="xy", scale=1, width=0.004)
    raw = ax.quiver(np.zeros(n), np.zeros(n), vectors[:, 0], vectors[:, 1], color="0.7", **kw)
    clip = ax.quiver(np.zeros(n), np.zeros(n), clipped[:, 0], clipped[:, 1], color="C0", alpha=0.8, **kw)
    m = np.stack([mean, clipped_mean])
    means = ax.quiver([0, 0], [0, 0], m[:, 0], m[:, 1], color=["k", "C3"], **(kw | {"width": 0.012}))
    ball = Circle((0, 0), max_grad_norm, fill=False, color="C3", lw=2, ls="--")
    ax.add_patch(ball)
    r = float(np.abs(vectors).max()) * 1.1 if n else 1.0
    ax.set_xlim(-r, r)
    ax.set_ylim(-r, r)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("gradients, clipped (blue), ball C", fontsize="small")
    return ArrowArtists(ax, raw, clip, means, ball)


def update_arrows(
    art: ArrowArtists, *, clipped: np.ndarray, max_grad_norm: float, clipped_mean: np.ndarray, mean: np.ndarray
) -> None:
    """Redraw the clipped arrows, the ball and the means in place."""
    art.clipped.set_UVC(clipped[:, 0], clipped[:, 1])
    m = np.stack([mean, clipped_mean])
    art.means.set_UVC(m[:, 0], m[:, 1])
    art.ball.set_radius(max_grad_norm)
