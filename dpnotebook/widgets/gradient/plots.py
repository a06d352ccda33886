"""Plots of per-sample gradients, usable without widgets.

>>> import numpy as np
>>> gradient_image(np.ones((4, 2, 3, 3))).shape        # 4 x 2 filters of 3 x 3, 1-pixel gaps
(15, 7)
>>> from matplotlib.figure import Figure
>>> ax = Figure().add_subplot()
>>> art = draw_gradient(ax, np.arange(6.0).reshape(2, 3), title="weight")
>>> update_gradient(art, np.ones(5), title="bias")
>>> art.image.get_array().shape
(1, 5)
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D

__all__ = [
    "gradient_image",
    "GradientArtists",
    "draw_gradient",
    "update_gradient",
    "NormArtists",
    "draw_layer_norms",
    "update_layer_norms",
]


def gradient_image(g: np.ndarray) -> np.ndarray:
    """A 2-D picture of one gradient: a matrix as is, a vector as one row, convolution filters
    ``[out, in, *kernel]`` as a mosaic (rows: output channels) separated by NaN gaps."""
    g = np.asarray(g, dtype=float)
    if g.ndim <= 1:
        return g.reshape(1, -1)
    if g.ndim == 2:
        return g
    out, inp = g.shape[:2]
    kernel = g.reshape(out, inp, g.shape[2], -1)  # conv1d: [out, in, 1, k]; conv3d: depth folded in
    if g.ndim == 3:
        kernel = g.reshape(out, inp, 1, g.shape[2])
    kh, kw = kernel.shape[2:]
    mosaic = np.full((out * (kh + 1) - 1, inp * (kw + 1) - 1), np.nan)
    for o in range(out):
        for i in range(inp):
            mosaic[o * (kh + 1) : o * (kh + 1) + kh, i * (kw + 1) : i * (kw + 1) + kw] = kernel[o, i]
    return mosaic


@dataclass
class GradientArtists:
    """The heatmap of one gradient and its colour bar."""

    ax: Axes
    image: AxesImage
    colorbar: Colorbar | None


def _limit(img: np.ndarray) -> float:
    finite = np.abs(img[np.isfinite(img)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def draw_gradient(ax: Axes, g: np.ndarray, *, title: str = "", colorbar: bool = True) -> GradientArtists:
    """A diverging heatmap of :func:`gradient_image` of ``g`` (red positive, blue negative)."""
    img = gradient_image(g)
    v = _limit(img)
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="white")
    image = ax.imshow(img, cmap=cmap, vmin=-v, vmax=v, interpolation="nearest", aspect="auto")
    ax.set_title(title, fontsize="small")
    ax.set_xticks([])
    ax.set_yticks([])
    cbar = ax.figure.colorbar(image, ax=ax) if colorbar else None
    if cbar is not None:
        cbar.set_ticks([-v, 0.0, v], labels=[f"{-v:.2g}", "0", f"{v:.2g}"])
    return GradientArtists(ax, image, cbar)


def update_gradient(art: GradientArtists, g: np.ndarray, *, title: str | None = None) -> None:
    """Show another gradient in the same image artist."""
    img = gradient_image(g)
    h, w = img.shape
    v = _limit(img)
    art.image.set_data(img)
    art.image.set_extent((-0.5, w - 0.5, h - 0.5, -0.5))
    art.image.set_clim(-v, v)
    if art.colorbar is not None:
        art.colorbar.set_ticks([-v, 0.0, v], labels=[f"{-v:.2g}", "0", f"{v:.2g}"])
    art.ax.set_xlim(-0.5, w - 0.5)
    art.ax.set_ylim(h - 0.5, -0.5)
    if title is not None:
        art.ax.title.set_text(title)


@dataclass
class NormArtists:
    """One line of per-sample norms per layer, the selected sample's line and marker (the title names
    the highlighted layer: a legend costs more to draw than the rest)."""

    ax: Axes
    lines: list[Line2D]
    sample_line: Line2D
    marker: Line2D
    names: list[str]


def draw_layer_norms(ax: Axes, names: list[str], norms: np.ndarray, *, layer: int, sample: int) -> NormArtists:
    """Per-sample gradient norm (log y) against sample index, one line per layer ``norms[L, B]``."""
    x = np.arange(norms.shape[1])
    lines = [ax.plot(x, n, marker=".", lw=1, label=name)[0] for name, n in zip(names, norms, strict=True)]
    sample_line = ax.axvline(sample, color="k", lw=1, ls=":")
    (marker,) = ax.plot([sample], [norms[layer, sample]], "o", ms=10, mfc="none", mec="k", mew=2)
    ax.set_yscale("log")
    ax.set_xlabel("sample")
    ax.set_ylabel("gradient norm")
    ax.set_title(" ", fontsize="small")
    art = NormArtists(ax, lines, sample_line, marker, list(names))
    update_layer_norms(art, norms, layer=layer, sample=sample)
    return art


def update_layer_norms(art: NormArtists, norms: np.ndarray, *, layer: int, sample: int) -> None:
    """Highlight ``layer``, mark ``sample``, and show ``norms`` (e.g. of another mode)."""
    for i, (line, n) in enumerate(zip(art.lines, norms, strict=True)):
        line.set_ydata(n)
        line.set_linewidth(2.5 if i == layer else 0.8)
        line.set_alpha(1.0 if i == layer else 0.35)
    art.sample_line.set_xdata([sample, sample])
    art.marker.set_data([sample], [norms[layer, sample]])
    art.ax.title.set_text(f"thick line: {art.names[layer]}")
    art.ax.title.set_color(art.lines[layer].get_color())
