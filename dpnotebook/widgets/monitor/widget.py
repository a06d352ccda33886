"""``TrainingMonitor``: live loss, accuracy, epsilon and clip-fraction curves with a progress bar, as a callback:

>>> monitor = TrainingMonitor(total_steps=3, redraw_every=0, progress=False, backend="static")
>>> for step in range(1, 4):
...     monitor.update(step=step, loss=1.0 / step, accuracy=0.3 * step, epsilon=0.1 * step, clip_fraction=0.5)
>>> monitor.plots["loss"].line.get_xdata().tolist()
[1.0, 2.0, 3.0]
>>> monitor.close()
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import ipywidgets

from dpnotebook.widgets._explorer import Explorer
from dpnotebook.widgets._figure import in_kernel
from dpnotebook.widgets.monitor import plots
from dpnotebook.widgets.monitor.state import METRICS, MonitorState

__all__ = ["TrainingMonitor"]


def _progress_bar(total: int | None, enabled: bool) -> tuple[Any, ipywidgets.Widget | None]:
    """A tqdm bar: the notebook one and its widget (shown in the monitor), or the text one."""
    if not enabled:
        return None, None
    if in_kernel():
        from tqdm.notebook import tqdm as notebook_tqdm

        bar = notebook_tqdm(total=total, desc="training", unit="step", display=False)
        return bar, bar.container
    from tqdm import tqdm

    return tqdm(total=total, desc="training", unit="step", file=sys.stderr, leave=False), None


class TrainingMonitor(Explorer[MonitorState]):
    """Plots of the metrics of a (DP) training run, redrawn at most every ``redraw_every`` seconds.

    Args:
        total_steps: steps expected (sets the progress bar's length), or ``None``.
        redraw_every: least seconds between redraws; :meth:`close` always redraws.
        target_epsilon: a privacy budget to draw on the epsilon plot.
        progress: show a tqdm progress bar.
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.

    Attributes:
        plots: the artists of each metric, by name.
        progress: the tqdm bar, or ``None``.
    """

    watch = ("target_epsilon",)
    tick_bins = 3

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        redraw_every: float = 0.5,
        target_epsilon: float | None = None,
        progress: bool = True,
        backend: str = "auto",
    ) -> None:
        state = MonitorState(total_steps=total_steps, redraw_every=redraw_every, target_epsilon=target_epsilon)
        self.progress, self._progress_view = _progress_bar(state.total_steps, progress)
        self._last_draw = -math.inf
        self._epsilon_owed: tuple[Any, float] | None = None  # log_step's engine and delta, its last step skipped
        super().__init__(state, figsize=(9.0, 4.6), backend=backend)

    def _build(self, fig: Any) -> None:
        s: MonitorState = self.state
        axes = fig.subplots(2, 2, sharex=True).ravel()
        self.plots = {
            name: plots.draw_metric(
                ax,
                title,
                color=f"C{i}",
                unit_range=name in ("accuracy", "clip_fraction"),
                target=s.target_epsilon if name == "epsilon" else None,
                xlabel="step" if i >= 2 else "",
            )
            for i, (ax, (name, title)) in enumerate(zip(axes, METRICS.items(), strict=True))
        }

    def _update(self) -> None:
        s: MonitorState = self.state
        for name, art in self.plots.items():
            steps, values = s.series(name)
            if art.target is not None and s.target_epsilon is not None:
                art.target.set_ydata([s.target_epsilon, s.target_epsilon])
            plots.update_metric(art, steps, values)

    def _controls(self) -> list[ipywidgets.Widget]:
        return [self._progress_view] if self._progress_view is not None else []

    def update(
        self,
        step: int | None = None,
        *,
        loss: float | None = None,
        accuracy: float | None = None,
        epsilon: float | None = None,
        clip_fraction: float | None = None,
        force: bool = False,
    ) -> None:
        """Record one step's metrics (``None`` ones are skipped) and redraw if it is time.

        Raises:
            WidgetValueError: a metric is invalid (``accuracy=1.5``, a nan loss) or ``step`` went back
                (nothing is recorded then).
        """
        s: MonitorState = self.state
        before = s.step
        step = s.record(step, loss=loss, accuracy=accuracy, epsilon=epsilon, clip_fraction=clip_fraction)
        if self.progress is not None:
            self.progress.update(step - before)
            shown = {k: f"{s.last(k):.3g}" for k in ("loss", "epsilon") if s.last(k) is not None}
            if shown:
                self.progress.set_postfix(shown, refresh=False)
        if force or time.monotonic() - self._last_draw >= s.redraw_every:
            self.redraw()

    __call__ = update

    def log_step(
        self,
        loss: float,
        *,
        optimizer: Any = None,
        privacy_engine: Any = None,
        delta: float = 1e-5,
        accuracy: float | None = None,
        step: int | None = None,
    ) -> None:
        """:meth:`update` with the clip fraction of ``optimizer.last_step_stats`` and the epsilon of
        ``privacy_engine.get_epsilon(delta)``; epsilon is only computed when a redraw is due (it is slow),
        and for the last step by :meth:`close`, so the curve ends at the epsilon the run spent."""
        stats = getattr(optimizer, "last_step_stats", None)
        clip = stats.fraction_clipped if stats is not None else None
        due = time.monotonic() - self._last_draw >= self.state.redraw_every
        epsilon = privacy_engine.get_epsilon(delta) if privacy_engine is not None and due else None
        self.update(step, loss=loss, accuracy=accuracy, epsilon=epsilon, clip_fraction=clip)
        self._epsilon_owed = (privacy_engine, delta) if privacy_engine is not None and epsilon is None else None

    def redraw(self) -> None:
        """Redraw now."""
        self._last_draw = time.monotonic()
        self.refresh()

    def close(self) -> None:
        """The last step's epsilon if :meth:`log_step` skipped it, a final redraw, and the progress bar closed.

        The figure stays, for the record.
        """
        if self._epsilon_owed is not None:
            engine, delta = self._epsilon_owed
            self._epsilon_owed = None
            self.state.record(self.state.step, epsilon=engine.get_epsilon(delta))
        self.redraw()
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
