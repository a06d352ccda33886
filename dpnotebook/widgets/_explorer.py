"""What every explorer shares: controls bound to a validated state, an error area, a static figure,
and a :class:`Debouncer` that postpones slow work until the sliders stop moving.

>>> area = ErrorArea()
>>> area.show(ValueError("max_grad_norm=-1 is invalid"))
>>> area.message
'ValueError: max_grad_norm=-1 is invalid'
>>> calls = []
>>> d = Debouncer(calls.append, delay=0.2)
>>> d(1); d(2)                     # no event loop here: both run at once
>>> calls
[1, 2]
"""

from __future__ import annotations

import asyncio
import base64
import html
import math
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import ipywidgets
import traitlets
from matplotlib.figure import Figure

from dpnotebook.widgets._figure import FigureHost, lighten

__all__ = ["ErrorArea", "Explorer", "Debouncer", "c_slider"]

S = TypeVar("S", bound=traitlets.HasTraits)  # an explorer's state class


class Debouncer:
    """Postpone ``fn`` until ``delay`` seconds passed without a newer call, in a running event loop
    (a Jupyter kernel); without one, or with ``delay=0``, a call runs at once."""

    def __init__(self, fn: Callable[..., Any], delay: float = 0.25) -> None:
        if delay < 0:
            raise ValueError(f"delay={delay!r} is invalid: it must be >= 0 seconds.")
        self.fn = fn
        self.delay = delay
        self._handle: asyncio.TimerHandle | None = None
        self._args: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    @property
    def pending(self) -> bool:
        """``True`` while a call waits to run."""
        return self._handle is not None

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop() if self.delay > 0 else None
        except RuntimeError:
            return None

    @property
    def immediate(self) -> bool:
        """``True`` when a call would run at once (no delay, or no running event loop)."""
        return self._loop() is None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.cancel()
        loop = self._loop()
        if loop is None:
            self.fn(*args, **kwargs)
        else:
            self._args = (args, kwargs)
            self._handle = loop.call_later(self.delay, self.flush)

    def cancel(self) -> None:
        """Drop the pending call, if any."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._args = None

    def flush(self) -> None:
        """Run the pending call now, if any."""
        if self._args is not None:
            args, kwargs = self._args
            self._handle = self._args = None
            self.fn(*args, **kwargs)


def c_slider(max_grad_norm: float, description: str = "C", decades: float = 2) -> ipywidgets.FloatLogSlider:
    """A log slider for C spanning ``decades`` on each side of ``max_grad_norm`` (rounded out)."""
    lo = math.floor(math.log10(max_grad_norm)) - decades
    return ipywidgets.FloatLogSlider(
        base=10, min=lo, max=lo + 2 * decades, step=0.01, description=description, readout_format=".3g"
    )


class ErrorArea:
    """A red message box inside the widget; hidden while there is nothing to say.

    Attributes:
        view: the ``ipywidgets.HTML`` that shows the message.
        message: ``"TypeName: text"`` of the last error, ``""`` when cleared.
        exception: the last exception, or ``None``.
    """

    def __init__(self) -> None:
        self.view = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))
        self.message = ""
        self.exception: BaseException | None = None

    def show(self, exc: BaseException) -> None:
        """Display ``exc`` with its traceback folded underneath."""
        self.exception = exc
        self.message = f"{type(exc).__name__}: {exc}"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.view.value = (
            '<div style="color:#b00020;border-left:4px solid #b00020;padding:2px 8px">'
            f"<b>{html.escape(self.message)}</b>"
            f"<details><summary>traceback</summary><pre>{html.escape(tb)}</pre></details></div>"
        )
        self.view.layout.display = ""

    def clear(self) -> None:
        """Hide the message."""
        self.exception = None
        self.message = self.view.value = ""
        self.view.layout.display = "none"


def _widen(control: ipywidgets.Widget, value: Any) -> None:
    """Stretch a slider's range so that it can show ``value`` (set programmatically)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not hasattr(control, "max"):
        return
    if isinstance(control, ipywidgets.FloatLogSlider):
        if value <= 0:
            return
        value = math.log(value, control.base)
        control.max, control.min = max(control.max, math.ceil(value)), min(control.min, math.floor(value))
    else:
        control.max, control.min = max(control.max, value), min(control.min, value)


class Explorer(Generic[S]):
    """Base class of the explorers: a subclass builds its figure once (:meth:`_build`), moves its artists
    to show the state (:meth:`_update`) and lists its controls (:meth:`_controls`).

    Args:
        state: the validated state (a ``traitlets.HasTraits``).
        figsize: figure size in inches.
        backend: how the figure is shown, see :class:`~dpnotebook.widgets._figure.FigureHost`.
        dpi: figure resolution.

    Attributes:
        state: the validated state; set its traits to move the widget.
        controls: the control widgets, by the name of the trait they drive.
        error: where exceptions raised in callbacks are shown.
        widget: the ``ipywidgets.VBox`` to display.
        label: the figure's one-line summary (a ``Text``), or ``None``: live it is hidden and shown
            as :attr:`caption` (HTML) above the figure; static pictures draw it.
    """

    watch: tuple[str, ...] = ()
    #: at most this many tick labels per axis (see :func:`~dpnotebook.widgets._figure.lighten`)
    tick_bins: int = 4

    def __init__(
        self, state: S, *, figsize: tuple[float, float] = (9.0, 3.0), backend: str = "auto", dpi: float = 72
    ) -> None:
        self.state = state
        self.error = ErrorArea()
        self.host = FigureHost(figsize, dpi=dpi, backend=backend)
        self.controls: dict[str, ipywidgets.Widget] = {}
        self.caption = ipywidgets.HTML()
        self.label: Any = None
        self._syncing = False
        self._build(self.host.figure)
        lighten(self.host.figure, nbins=self.tick_bins)
        self.host.after_layout.append(self._hide_label)
        self._update()
        self._sync_caption()
        controls = ipywidgets.HBox(self._controls(), layout=ipywidgets.Layout(flex_flow="row wrap"))
        self.widget = ipywidgets.VBox([controls, self.caption, self.host.view, self.error.view])
        if self.watch:
            self.state.observe(lambda change: self.refresh(), names=list(self.watch))
        self.host.redraw()

    def _build(self, fig: Figure) -> None:
        raise NotImplementedError

    def _update(self) -> None:
        raise NotImplementedError

    def _controls(self) -> list[ipywidgets.Widget]:
        return []

    def _hide_label(self) -> None:
        if self.label is not None:  # live, the caption shows it (text is most of a redraw's cost)
            self.label.set_visible(False)

    def _sync_caption(self) -> None:
        if self.label is not None:
            self.caption.value = f"<small>{html.escape(self.label.get_text())}</small>"

    def refresh(self) -> None:
        """Update the artists from the state and redraw; errors go to :attr:`error`."""
        try:
            self._update()
            self._sync_caption()
            self.host.redraw()
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.error.show(exc)

    def _set_control(self, control: ipywidgets.Widget, value: Any) -> None:
        self._syncing = True
        try:
            _widen(control, value)
            control.value = value
        finally:
            self._syncing = False

    def bind(self, name: str, control: ipywidgets.ValueWidget) -> ipywidgets.ValueWidget:
        """Keep ``control.value`` and ``state.<name>`` equal; refused values are shown and undone."""
        self._set_control(control, getattr(self.state, name))

        def on_control(change: dict[str, Any]) -> None:
            if self._syncing:
                return
            try:
                setattr(self.state, name, change["new"])
            except Exception as exc:  # noqa: BLE001 - shown to the user
                self.error.show(exc)
                self._set_control(control, getattr(self.state, name))
            else:
                if isinstance(self.error.exception, traitlets.TraitError):
                    self.error.clear()

        control.observe(on_control, names="value")
        self.state.observe(lambda change: self._set_control(control, change["new"]), names=name)
        self.controls[name] = control
        return control

    def bind_all(self, **controls: ipywidgets.ValueWidget) -> list[ipywidgets.Widget]:
        """:meth:`bind` each control to the trait of its keyword; the bound controls, in order."""
        return [self.bind(name, control) for name, control in controls.items()]

    def set(self, **values: Any) -> None:
        """Set several state traits, then redraw once.

        Values are checked together, so ``set(batch_size=500, dataset_size=1000)``
        works whatever the order.

        Raises:
            WidgetValueError: a value is refused (then nothing is changed).
        """
        with self.state.hold_trait_notifications():
            for key, value in values.items():
                setattr(self.state, key, value)

    @property
    def figure(self) -> Figure:
        """The matplotlib figure (created once, updated in place)."""
        return self.host.figure

    def show_static(self) -> Any:
        """An ``IPython.display.Image`` of the figure, for pages without a kernel."""
        from IPython.display import Image

        return Image(data=self._png(), format="png")

    def _png(self) -> bytes:  # with the summary line drawn in it
        if self.label is None:
            return self.host.png()
        self.host.freeze_layout()
        self.label.set_visible(True)
        try:
            self.host.draw()
            return self.host.encode()
        finally:
            self.label.set_visible(False)
            self.host.mark_stale()

    def _repr_png_(self) -> bytes:
        return self._png()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["image/png"] = base64.b64encode(self._png()).decode("ascii")
        return data

    def close(self) -> None:
        """Close the widgets and the figure."""
        for control in self.controls.values():
            control.close()
        self.widget.close()
        self.host.close()
