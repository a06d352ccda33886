"""One figure per widget: created once, shown live, redrawn in place, cheap to redraw.

``backend`` picks how it is shown: ``"ipympl"`` (the figure's own interactive canvas,
``%matplotlib widget``), ``"image"`` (Agg pixels sent to an ``ipywidgets.Image`` after each
redraw) or ``"static"`` (drawn only when asked, e.g. by :meth:`FigureHost.png`). ``"auto"``
chooses ipympl when it is the active backend, ``"image"`` inside a kernel, else ``"static"``.
No figure goes through pyplot, so ``plt.get_fignums()`` never grows.

>>> host = FigureHost((3, 2), backend="static")
>>> ax = host.figure.add_subplot()
>>> ax.set_xscale("log")
>>> lighten(host.figure)
>>> type(ax.xaxis.get_minor_locator()).__name__, ax.xaxis.get_major_formatter()(0.01, 0)
('NullLocator', '0.01')
>>> host.png()[:4]
b'\\x89PNG'
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable

import ipywidgets
import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

from dpnotebook.widgets._validate import one_of

__all__ = ["FigureHost", "in_kernel", "ipympl_active", "lighten", "pin_labels", "BACKENDS"]

BACKENDS = ("auto", "ipympl", "image", "static")


def lighten(fig: Figure, *, nbins: int = 4, labelsize: float = 8) -> None:
    """At most ``nbins`` plain tick labels per axis, no minor ticks (most of a redraw's cost); after setting scales."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if not axis.get_ticklocs().size:  # ticks switched off on purpose
                continue
            if axis.get_scale() == "log":
                lo, hi = sorted(axis.get_view_interval())
                narrow = lo > 0 and math.log10(hi / lo) < 1.5  # under 1.5 decades: 1-2-5 ticks
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if narrow else (1.0,), numticks=nbins))
                axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            elif axis.get_scale() == "linear":
                axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
            axis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=labelsize)


def pin_labels(fig: Figure) -> None:
    """Keep axis labels and titles where the last draw put them (no re-measuring on each draw)."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.label
            if label.get_text():
                x, y = ax.transAxes.inverted().transform(label.get_transform().transform(label.get_position()))
                axis.set_label_coords(x, y)
        if ax.get_title():
            title = ax.title
            ax.set_title(
                ax.get_title(), y=title.get_position()[1], fontsize=title.get_fontsize(), color=title.get_color()
            )


def in_kernel() -> bool:
    """``True`` inside a running Jupyter kernel."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def ipympl_active() -> bool:
    """``True`` when ``%matplotlib widget`` (ipympl) is the matplotlib backend."""
    return "ipympl" in matplotlib.get_backend() or matplotlib.get_backend() == "widget"


class FigureHost:
    """Owns a figure and the widget that shows it.

    Args:
        figsize: figure size in inches.
        dpi: resolution; 72 keeps a redraw fast.
        backend: one of ``"auto"``, ``"ipympl"``, ``"image"``, ``"static"``.

    Attributes:
        figure: the matplotlib figure, created once.
        view: the widget that shows it (an ipympl canvas, an ``Image``, or an empty ``HTML``).
        backend: the resolved backend.
    """

    def __init__(self, figsize: tuple[float, float], *, dpi: float = 72, backend: str = "auto") -> None:
        one_of("backend", backend, BACKENDS)
        if backend == "auto":
            backend = "ipympl" if ipympl_active() else "image" if in_kernel() else "static"
        self.backend = backend
        self.figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        if backend == "ipympl":
            from ipympl.backend_nbagg import Canvas, FigureManager

            canvas = Canvas(self.figure)
            with warnings.catch_warnings():  # ipympl's Toolbar passes traitlets an unused argument
                warnings.simplefilter("ignore", DeprecationWarning)
                self._manager = FigureManager(canvas, 0)  # the toolbar; not registered with pyplot
            canvas.header_visible, canvas.toolbar_position = False, "right"
            # A canvas view takes its browser size from ``_size`` when created; ipympl sets it only
            # when the canvas itself is displayed, never as a VBox child: a view at (0, 0) stays blank.
            width, height = self.figure.bbox.size
            ratio = getattr(canvas, "device_pixel_ratio", 1) or 1
            canvas._size = (float(width) / ratio, float(height) / ratio)
            self.view: ipywidgets.Widget = canvas
        else:
            FigureCanvasAgg(self.figure)
            image = backend == "image"
            self.view = ipywidgets.Image(format="png", layout={"max_width": "100%"}) if image else ipywidgets.HTML()
        self._frozen = False
        self._stale = True
        self.after_layout: list[Callable[[], None]] = []
        self._draw_cid = self.figure.canvas.mpl_connect("draw_event", self._on_first_draw)

    def _on_first_draw(self, event: object = None) -> None:  # whoever drew: keep that layout from now on
        if not self._frozen:
            self.figure.set_layout_engine("none")
            pin_labels(self.figure)
            self._frozen = True
            for callback in self.after_layout:
                callback()
        self.figure.canvas.mpl_disconnect(self._draw_cid)

    def freeze_layout(self) -> None:
        """Lay the figure out once (constrained layout), then keep the axes where they are."""
        if not self._frozen:
            self.draw()  # the draw event freezes the layout

    def redraw(self) -> None:
        """Show the artists' new data: ``draw_idle`` live, or a new image, or mark stale (static)."""
        self._stale = True
        if self.backend == "static":
            return
        self.freeze_layout()
        if self.backend == "ipympl":
            self.figure.canvas.draw_idle()
        else:
            self.draw()
            self.view.value = self.encode()

    def draw(self) -> None:
        """Render now, whatever the backend."""
        self.figure.canvas.draw()
        self._stale = False

    def mark_stale(self) -> None:
        """Note that the artists changed without a redraw."""
        self._stale = True

    def encode(self) -> bytes:
        """The pixels of the last draw as PNG bytes (fast: zlib level 1)."""
        buf = io.BytesIO()
        canvas = self.figure.canvas
        if not isinstance(canvas, FigureCanvasAgg):  # pragma: no cover - other canvases
            self.figure.savefig(buf, format="png")
            return buf.getvalue()
        from PIL import Image

        width, height = canvas.get_width_height(physical=True)
        image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        image.save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def png(self) -> bytes:
        """The figure as PNG bytes, drawn first if anything changed."""
        if self._stale or not self._frozen:
            self.draw()
        return self.encode()

    def close(self) -> None:
        """Close the live view (the figure itself stays usable for :meth:`png`)."""
        self.view.close()
