"""Plots for augmentation multiplicity, usable without widgets.

>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_k_curves(ax, np.array([1.0, 0.8, 0.7]), np.array([1.0, 0.5, 0.33]), K=1)
>>> update_k_curves(art, K=3)
>>> art.k_line.get_xdata()
[3, 3]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import StepPatch
from matplotlib.ticker import NullFormatter

from dpnotebook.widgets.clipping.plots import log_bins

__all__ = [
    "KHistogramArtists",
    "draw_k_histogram",
    "update_k_histogram",
    "KCurveArtists",
    "draw_k_curves",
    "update_k_curves",
    "FractionArtists",
    "draw_fraction_curve",
    "update_fraction_curve",
]


@dataclass
class KHistogramArtists:
    """Histogram of norms at the current K, the K=1 histogram as an outline, the C line."""

    ax: Axes
    hist: StepPatch
    base: StepPatch
    c_line: Line2D
    edges: np.ndarray


def draw_k_histogram(ax: Axes, all_norms: list[np.ndarray], *, K: int, max_grad_norm: float) -> KHistogramArtists:
    """Per-sample norms at ``K`` (filled) and at ``K = 1`` (outline); bins fit every K."""
    edges = log_bins(np.concatenate(all_norms), 30)
    base_counts, _ = np.histogram(all_norms[0], edges)
    counts, _ = np.histogram(all_norms[K - 1], edges)
    base = ax.stairs(base_counts, edges, color="0.5", lw=1.2, label="K = 1")
    hist = ax.stairs(counts, edges, fill=True, alpha=0.6, color="C0", label="current K")
    c_line = ax.axvline(max_grad_norm, color="C3", lw=2, label="C")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(edges[0], edges[-1])
    top = max(max(np.histogram(n, edges)[0].max() for n in all_norms), 1)
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("per-sample gradient norm")
    ax.set_ylabel("samples")
    ax.legend(fontsize="x-small", loc="upper left")
    return KHistogramArtists(ax, hist, base, c_line, edges)


def update_k_histogram(art: KHistogramArtists, norms: np.ndarray, *, K: int, max_grad_norm: float) -> None:
    """Show the norms at ``K`` and move the C line."""
    counts, _ = np.histogram(norms, art.edges)
    art.hist.set_data(counts, art.edges)
    art.c_line.set_xdata([max_grad_norm, max_grad_norm])


@dataclass
class KCurveArtists:
    """Mean norm and variance against K, relative to K = 1, with 1/K for reference."""

    ax: Axes
    norm: Line2D
    variance: Line2D
    k_line: Line2D


def draw_k_curves(ax: Axes, norm: np.ndarray, variance: np.ndarray, *, K: int) -> KCurveArtists:
    """Mean per-sample norm and augmentation variance for ``K = 1 .. len(norm)``, divided by their K=1 values."""
    ks = np.arange(1, len(norm) + 1)
    ax.plot(ks, 1 / ks, color="0.6", ls=":", label="1 / K")
    (norm_line,) = ax.plot(ks, norm / norm[0], marker=".", color="C0", label="mean norm")
    (var_line,) = ax.plot(
        ks,
        variance / variance[0] if variance[0] > 0 else variance,
        marker=".",
        color="C1",
        label="augmentation variance",
    )
    k_line = ax.axvline(K, color="k", lw=1, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("K (augmented copies per sample)")
    ax.set_ylabel("relative to K = 1")
    ax.legend(fontsize="x-small", loc="lower left")
    return KCurveArtists(ax, norm_line, var_line, k_line)


def update_k_curves(art: KCurveArtists, *, K: int) -> None:
    """Move the current-K marker."""
    art.k_line.set_xdata([K, K])


@dataclass
class FractionArtists:
    """Fraction clipped against K at the current C, and the current K."""

    ax: Axes
    curve: Line2D
    point: Line2D


def draw_fraction_curve(ax: Axes, fractions: np.ndarray, *, K: int) -> FractionArtists:
    """The fraction of samples clipped for each K."""
    ks = np.arange(1, len(fractions) + 1)
    (curve,) = ax.plot(ks, fractions, marker=".", color="C3")
    (point,) = ax.plot([K], [fractions[K - 1]], "o", color="C3", ms=9)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("K")
    ax.set_ylabel("fraction clipped")
    return FractionArtists(ax, curve, point)


def update_fraction_curve(art: FractionArtists, fractions: np.ndarray, *, K: int) -> None:
    """New fractions (another C) and the current K."""
    ks = np.arange(1, len(fractions) + 1)
    art.curve.set_data(ks, fractions)
    art.point.set_data([K], [fractions[K - 1]])
