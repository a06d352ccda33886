"""One figure per widget: created once, shown live, redrawn in place.

Three ways to show it, picked by ``backend``:

* ``"ipympl"``: the figure's own interactive canvas (``%matplotlib widget``);
  an update calls ``fig.canvas.draw_idle()``.
* ``"image"``: an Agg figure whose pixels go to an ``ipywidgets.Image`` after
  each redraw; works in JupyterLab 4 and Notebook 7 without ipympl.
* ``"static"``: nothing live (scripts, tests, doctests); the figure is drawn
  only when asked, e.g. by :meth:`FigureHost.png`.

``"auto"`` chooses ipympl when it is the active backend, ``"image"`` inside a
Jupyter kernel, ``"static"`` elsewhere. No figure goes through pyplot, so
``plt.get_fignums()`` never grows, whatever the sliders do.

>>> host = FigureHost((3, 2), backend="static")
>>> ax = host.figure.add_subplot()
>>> host.png()[:4]
b'\\x89PNG'
"""

from __future__ import annotations

import base64
import io
import warnings

import ipywidgets
import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dpnotebook.widgets._style import pin_labels
from dpnotebook.widgets._validate import one_of

__all__ = ["FigureHost", "in_kernel", "ipympl_active", "BACKENDS"]

BACKENDS = ("auto", "ipympl", "image", "static")


def in_kernel() -> bool:
    """``True`` inside a running Jupyter kernel."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def ipympl_active() -> bool:
    """``True`` when ``%matplotlib widget`` (ipympl) is the matplotlib backend."""
    return "ipympl" in matplotlib.get_backend() or matplotlib.get_backend() == "widget"


def _resolve(backend: str) -> str:
    one_of("backend", backend, BACKENDS)
    if backend != "auto":
        return backend
    if ipympl_active():
        return "ipympl"
    return "image" if in_kernel() else "static"


def _size_canvas(canvas: ipywidgets.Widget) -> None:
    """Give an ipympl canvas its size in the browser now, before any view of it exists.

    A canvas view takes its size from the model's ``_size`` when it is created. ipympl
    sets ``_size`` only when the canvas itself is displayed (``Canvas._repr_mimebundle_``)
    or once the browser's ``initialized`` message is handled, after the cell has run. A
    canvas shown as a child of a ``VBox`` is never displayed itself, and its view is
    created while ``_size`` is still ``(0, 0)``: the later resize can miss the view,
    which then stays at 0 x 0 pixels and shows nothing.
    """
    if not hasattr(canvas, "_size"):  # pragma: no cover - other ipympl versions
        return
    width, height = canvas.figure.bbox.size
    ratio = getattr(canvas, "device_pixel_ratio", 1) or 1
    canvas._size = (float(width) / ratio, float(height) / ratio)


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
        self.backend = _resolve(backend)
        if self.backend == "ipympl":
            from ipympl.backend_nbagg import Canvas, FigureManager

            self.figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
            canvas = Canvas(self.figure)
            with warnings.catch_warnings():  # ipympl's Toolbar passes traitlets an unused argument
                warnings.simplefilter("ignore", DeprecationWarning)
                self._manager = FigureManager(canvas, 0)  # the toolbar; not registered with pyplot
            for name, value in (("header_visible", False), ("toolbar_position", "right")):
                if hasattr(canvas, name):
                    setattr(canvas, name, value)
            _size_canvas(canvas)
            self.view: ipywidgets.Widget = canvas
        else:
            self.figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
            FigureCanvasAgg(self.figure)
            self.view = (
                ipywidgets.Image(format="png", layout=ipywidgets.Layout(max_width="100%"))
                if self.backend == "image"
                else ipywidgets.HTML()
            )
        self._frozen = False
        self._stale = True
        self.after_layout: list = []
        self._draw_cid = self.figure.canvas.mpl_connect("draw_event", self._on_first_draw)

    def _on_first_draw(self, event: object = None) -> None:
        """After the first draw, by whoever (``png``, ipympl, ``fig.canvas.draw()``), keep the layout."""
        if not self._frozen:
            self.figure.set_layout_engine("none")
            pin_labels(self.figure)
            self._frozen = True
            for callback in self.after_layout:
                callback()
        self.figure.canvas.mpl_disconnect(self._draw_cid)

    def freeze_layout(self) -> None:
        """Lay the figure out once (constrained layout), then keep the axes where they are.

        Constrained layout costs more than the rest of a redraw, so it runs only
        for the first draw.
        """
        if not self._frozen:
            self.figure.canvas.draw()  # the draw event freezes the layout
            self._stale = False

    def redraw(self) -> None:
        """Show the artists' new data: ``draw_idle`` live, or a new image, or mark stale.

        The first live redraw also lays the figure out (:meth:`freeze_layout`); a
        ``"static"`` figure is laid out when first drawn, e.g. by :meth:`png`.
        """
        self._stale = True
        if self.backend == "static":
            return
        if not self._frozen:
            self.freeze_layout()
        if self.backend == "ipympl":
            self.figure.canvas.draw_idle()
        elif self.backend == "image":
            self.figure.canvas.draw()
            self._stale = False
            self.view.value = self.encode()

    def draw(self) -> None:
        """Render now (Agg or the interactive canvas), whatever the backend."""
        self.figure.canvas.draw()
        self._stale = False

    def mark_stale(self) -> None:
        """Note that the artists changed without a redraw."""
        self._stale = True

    def encode(self) -> bytes:
        """The pixels of the last draw as PNG bytes (fast: zlib level 1)."""
        canvas = self.figure.canvas
        if not isinstance(canvas, FigureCanvasAgg):  # pragma: no cover - other canvases
            buf = io.BytesIO()
            self.figure.savefig(buf, format="png")
            return buf.getvalue()
        from PIL import Image

        width, height = canvas.get_width_height(physical=True)
        image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        image.save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def png(self) -> bytes:
        """The figure as PNG bytes, drawn first if anything changed."""
        if self._stale or not self._frozen:
            self.draw()
        return self.encode()

    def png_base64(self) -> str:
        """:meth:`png`, base64-encoded, as notebooks store images."""
        return base64.b64encode(self.png()).decode("ascii")

    def close(self) -> None:
        """Close the live view (the figure itself stays usable for :meth:`png`)."""
        self.view.close()
