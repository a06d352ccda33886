"""Plots of the privacy budget, usable without widgets.

>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_epsilon_curves(ax, np.array([1, 2, 3]), np.array([0.5, 0.8, 1.0]), target_epsilon=2.0)
>>> update_epsilon_curves(art, np.array([1, 2, 3]), np.array([1.0, 1.6, 2.0]), target_epsilon=2.0)
>>> art.current.get_ydata().tolist()
[1.0, 1.6, 2.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

__all__ = ["EpsilonArtists", "draw_epsilon_curves", "update_epsilon_curves"]


@dataclass
class EpsilonArtists:
    """Epsilon against epochs at the current sigma and at the required sigma, and the target."""

    ax: Axes
    current: Line2D
    final: Line2D
    required: Line2D
    target: Line2D


def draw_epsilon_curves(
    ax: Axes, epochs: np.ndarray, epsilons: np.ndarray, *, target_epsilon: float, required: np.ndarray | None = None
) -> EpsilonArtists:
    """Epsilon (y) against epochs (x): the current curve with its end marked, the curve at the
    sigma that meets the target (dashed), and the target (dotted)."""
    (current,) = ax.plot([], [], marker=".", color="C0", label="epsilon at current sigma")
    (final,) = ax.plot([], [], "o", color="C0", ms=9)
    (required_line,) = ax.plot([], [], ls="--", color="C2", label="at the sigma needed for the target")
    target = ax.axhline(target_epsilon, color="C3", ls=":", label="target epsilon")
    ax.set_xlabel("epochs")
    ax.set_ylabel("epsilon")
    ax.legend(fontsize="small", loc="upper left")
    art = EpsilonArtists(ax, current, final, required_line, target)
    update_epsilon_curves(art, epochs, epsilons, target_epsilon=target_epsilon, required=required)
    return art


def update_epsilon_curves(
    art: EpsilonArtists,
    epochs: np.ndarray,
    epsilons: np.ndarray,
    *,
    target_epsilon: float,
    required: np.ndarray | None = None,
    pending: bool = False,
) -> None:
    """New curves; ``pending`` greys them while a slow computation waits."""
    art.current.set_data(epochs, epsilons)
    art.final.set_data(epochs[-1:], epsilons[-1:])
    req = required if required is not None else np.full(len(epochs), np.nan)
    art.required.set_data(epochs, req)
    art.target.set_ydata([target_epsilon, target_epsilon])
    for line in (art.current, art.final, art.required):
        line.set_alpha(0.3 if pending else 1.0)
    finite = np.concatenate([v[np.isfinite(v)] for v in (epsilons, req, np.array([target_epsilon, 1e-3]))])
    art.ax.set_xlim(0, max(float(epochs[-1]), 1.0) * 1.05)
    art.ax.set_ylim(0, float(finite.max()) * 1.15)
