"""The shared machinery: validation, figure hosts, error area, binding, debounce, static output."""

from __future__ import annotations

import asyncio
import base64

import ipywidgets
import matplotlib.pyplot as plt
import pytest
import traitlets

from dpnotebook.widgets._explorer import Debouncer, ErrorArea, Explorer
from dpnotebook.widgets._figure import FigureHost
from dpnotebook.widgets._validate import (
    WidgetValueError,
    int_at_least,
    non_negative,
    one_of,
    open_unit,
    positive,
    unit_interval,
)


@pytest.mark.parametrize(
    "check, args, text",
    [
        (positive, ("max_grad_norm", -1.0), "max_grad_norm=-1.0 is invalid"),
        (positive, ("max_grad_norm", float("nan")), "max_grad_norm=nan is invalid"),
        (non_negative, ("sigma", -0.1), "sigma=-0.1 is invalid"),
        (open_unit, ("delta", 1.0), "delta=1.0 is invalid"),
        (unit_interval, ("accuracy", 2), "accuracy=2 is invalid"),
        (int_at_least, ("K", 0, 1), "K=0 is invalid"),
        (int_at_least, ("K", 2.5, 1), "K=2.5 is invalid"),
        (one_of, ("mode", "x", ["a"]), "mode='x' is invalid"),
    ],
)
def test_checks_name_argument_and_value(check, args, text):
    with pytest.raises(WidgetValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        check(*args)


def test_widget_value_error_is_value_and_trait_error():
    assert issubclass(WidgetValueError, ValueError)
    assert issubclass(WidgetValueError, traitlets.TraitError)


@pytest.mark.parametrize("backend", ["static", "image", "ipympl"])
def test_figure_host_backends(backend, fignums):
    host = FigureHost((3, 2), backend=backend)
    (line,) = host.figure.add_subplot().plot([0, 1], [0, 1])
    host.redraw()
    line.set_ydata([1, 0])
    host.redraw()
    assert host.png().startswith(b"\x89PNG")
    if backend == "image":
        assert bytes(host.view.value).startswith(b"\x89PNG")
    assert isinstance(host.view, ipywidgets.DOMWidget)
    assert host.figure.get_layout_engine() is not None  # frozen, not removed
    host.close()


def test_ipympl_canvas_sized_before_display():
    """The canvas's browser size is set at once: an explorer shows it inside a VBox, never by
    itself, and a view created at ``_size == (0, 0)`` stays 0 x 0 pixels (nothing drawn)."""
    host = FigureHost((3, 2), dpi=72, backend="ipympl")
    assert tuple(host.view._size) == pytest.approx((216.0, 144.0))
    host.close()


def test_figure_host_refuses_unknown_backend():
    with pytest.raises(WidgetValueError, match="backend='qt' is invalid"):
        FigureHost((3, 2), backend="qt")


def test_error_area_shows_and_clears():
    area = ErrorArea()
    assert area.view.layout.display == "none"
    try:
        raise RuntimeError("<bad> thing")
    except RuntimeError as exc:
        area.show(exc)
    assert area.message == "RuntimeError: <bad> thing"
    assert "&lt;bad&gt;" in area.view.value and "traceback" in area.view.value
    assert area.view.layout.display == ""
    area.clear()
    assert area.message == "" and area.view.layout.display == "none"


class _State(traitlets.HasTraits):
    c = traitlets.Float(1.0)

    @traitlets.validate("c")
    def _check(self, proposal):
        return positive("c", proposal["value"])


class _Demo(Explorer):
    watch = ("c",)

    def _build(self, fig):
        (self.line,) = fig.add_subplot().plot([0, 1], [0, 0])

    def _update(self):
        self.line.set_ydata([0, self.state.c])

    def _controls(self):
        return [self.bind("c", ipywidgets.FloatText())]


def test_bind_refuses_shows_and_reverts(fignums):
    demo = _Demo(_State(), backend="static")
    demo.controls["c"].value = 3.0
    assert demo.state.c == 3.0 and list(demo.line.get_ydata()) == [0, 3.0]
    demo.controls["c"].value = -2.0
    assert demo.state.c == 3.0
    assert demo.controls["c"].value == 3.0
    assert demo.error.message == "WidgetValueError: c=-2.0 is invalid: it must be a number > 0."
    demo.controls["c"].value = 4.0  # a good value clears the message
    assert demo.error.message == ""
    demo.state.c = 5.0  # state -> control
    assert demo.controls["c"].value == 5.0


def test_set_is_atomic():
    demo = _Demo(_State(), backend="static")
    with pytest.raises(WidgetValueError, match="c=0.0 is invalid"):
        demo.set(c=0)
    assert demo.state.c == 1.0


def test_exception_in_update_is_shown_not_raised(monkeypatch):
    demo = _Demo(_State(), backend="static")
    monkeypatch.setattr(demo, "_update", lambda: 1 / 0)
    demo.controls["c"].value = 2.0
    assert demo.state.c == 2.0
    assert demo.error.message == "ZeroDivisionError: division by zero"
    assert isinstance(demo.error.exception, ZeroDivisionError)


def test_slider_range_widens_for_programmatic_values():
    class S(traitlets.HasTraits):
        c = traitlets.Float(1.0)

    class D(_Demo):
        def _controls(self):
            return [self.bind("c", ipywidgets.FloatLogSlider(min=-1, max=1))]

    demo = D(S(), backend="static")
    demo.state.c = 1e4
    assert demo.controls["c"].value == pytest.approx(1e4)


def test_static_fallback_bundle():
    demo = _Demo(_State(), backend="static")
    bundle = demo._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert demo._repr_png_().startswith(b"\x89PNG")
    assert demo.show_static().data.startswith(b"\x89PNG")
    demo.close()


def test_debouncer_without_loop_runs_at_once():
    calls = []
    d = Debouncer(calls.append, delay=0.5)
    assert d.immediate
    d(1)
    assert calls == [1] and not d.pending


def test_debouncer_in_event_loop_keeps_only_the_last_call():
    calls = []

    async def main():
        d = Debouncer(calls.append, delay=0.05)
        assert not d.immediate
        for i in range(5):
            d(i)
        assert d.pending and calls == []
        await asyncio.sleep(0.15)
        assert not d.pending

    asyncio.run(main())
    assert calls == [4]


def test_debouncer_refuses_negative_delay():
    with pytest.raises(ValueError, match="delay=-1 is invalid"):
        Debouncer(print, delay=-1)


def test_no_pyplot_figures_anywhere():
    assert plt.get_fignums() == []
