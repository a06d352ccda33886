"""Plots of DP noise, usable without widgets.

>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_noise_cloud(ax, true_mean=np.array([1.0, 0.0]), clipped_mean=np.array([0.5, 0.0]),
...                        noisy=np.zeros((3, 2)), noise_std=0.1)
>>> update_noise_cloud(art, true_mean=np.array([1.0, 0.0]), clipped_mean=np.array([0.5, 0.0]),
...                    noisy=np.ones((3, 2)), noise_std=0.2)
>>> art.draws.get_offsets().tolist()
[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Circle
from matplotlib.quiver import Quiver

__all__ = ["CloudArtists", "draw_noise_cloud", "update_noise_cloud", "SnrArtists", "draw_snr_curve", "update_snr_curve"]


@dataclass
class CloudArtists:
    """The noisy gradients (dots), the true and clipped means (arrows), a 1-std circle."""

    ax: Axes
    draws: PathCollection
    means: Quiver
    circle: Circle


def _limits(ax: Axes, points: np.ndarray) -> None:
    r = float(np.abs(points).max()) * 1.15 if points.size else 1.0
    r = r if r > 0 and np.isfinite(r) else 1.0
    ax.set_xlim(-r, r)
    ax.set_ylim(-r, r)


def draw_noise_cloud(
    ax: Axes, *, true_mean: np.ndarray, clipped_mean: np.ndarray, noisy: np.ndarray, noise_std: float
) -> CloudArtists:
    """Noisy averaged gradients ``[n, 2]`` around the clipped mean, and the true mean, in 2-D."""
    draws = ax.scatter(noisy[:, 0], noisy[:, 1], s=14, color="C1", alpha=0.7, label="noisy averaged gradient")
    m = np.stack([true_mean, clipped_mean])
    means = ax.quiver(
        [0, 0], [0, 0], m[:, 0], m[:, 1], color=["k", "C0"], angles="xy", scale_units="xy", scale=1, width=0.012
    )
    circle = Circle(tuple(clipped_mean), noise_std, fill=False, color="C1", ls="--")
    ax.add_patch(circle)
    ax.plot([], [], color="k", label="true mean")
    ax.plot([], [], color="C0", label="clipped mean")
    ax.set_aspect("equal", adjustable="box")
    ax.axhline(0, color="0.85", lw=0.8)
    ax.axvline(0, color="0.85", lw=0.8)
    ax.legend(fontsize="x-small", loc="upper left")
    _limits(ax, np.vstack([noisy, m]))
    return CloudArtists(ax, draws, means, circle)


def update_noise_cloud(
    art: CloudArtists, *, true_mean: np.ndarray, clipped_mean: np.ndarray, noisy: np.ndarray, noise_std: float
) -> None:
    """Move the dots, arrows and circle, and rescale the axes to fit."""
    art.draws.set_offsets(noisy)
    m = np.stack([true_mean, clipped_mean])
    art.means.set_UVC(m[:, 0], m[:, 1])
    art.circle.set_center(tuple(clipped_mean))
    art.circle.set_radius(noise_std)
    _limits(art.ax, np.vstack([noisy, m]))


@dataclass
class SnrArtists:
    """The SNR-against-B curve and the current point."""

    ax: Axes
    curve: Line2D
    point: Line2D


def _snr_limits(ax: Axes, snr: np.ndarray) -> None:
    finite = snr[np.isfinite(snr) & (snr > 0)]
    if finite.size:
        ax.set_ylim(min(finite.min(), 0.5) / 1.5, max(finite.max(), 2.0) * 1.5)


def draw_snr_curve(ax: Axes, sizes: np.ndarray, snr: np.ndarray, *, batch_size: int, current: float) -> SnrArtists:
    """Signal-to-noise ratio against batch size (log-log), with SNR = 1 marked."""
    (curve,) = ax.plot(sizes, snr, color="C2", marker=".")
    (point,) = ax.plot([batch_size], [current], "o", color="C3", ms=9)
    ax.axhline(1.0, color="0.5", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)
    _snr_limits(ax, snr)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("SNR = |clipped mean| / |noise|")
    return SnrArtists(ax, curve, point)


def update_snr_curve(art: SnrArtists, sizes: np.ndarray, snr: np.ndarray, *, batch_size: int, current: float) -> None:
    """New curve data and current point."""
    art.curve.set_data(sizes, snr)
    art.point.set_data([batch_size], [current])
    _snr_limits(art.ax, snr)
