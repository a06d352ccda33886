"""The training monitor's state: the history of metrics, each value checked as it arrives.

>>> s = MonitorState(total_steps=100)
>>> s.record(loss=0.9, accuracy=0.5)
1
>>> s.record(loss=0.7, epsilon=0.3, clip_fraction=0.4)
2
>>> s.series("loss")
([1, 2], [0.9, 0.7])
>>> s.record(accuracy=1.5)
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: accuracy=1.5 is invalid: it must lie between 0 and 1.
"""

from __future__ import annotations

import math
from typing import Any

import traitlets

from dpnotebook.widgets._validate import int_at_least, non_negative, positive, refuse, unit_interval

__all__ = ["METRICS", "MonitorState"]

#: The metrics a monitor plots, in order, with their axis titles.
METRICS = {"loss": "loss", "accuracy": "accuracy", "epsilon": "epsilon spent", "clip_fraction": "fraction clipped"}


def _check(name: str, value: Any) -> float:
    if name in ("accuracy", "clip_fraction"):
        return unit_interval(name, value)
    if name == "epsilon":  # inf: a run without noise (get_epsilon's answer for sigma = 0)
        return math.inf if value == math.inf else non_negative(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        refuse(name, value, "it must be a finite number (a nan or inf loss means training diverged).")
    return float(value)


class MonitorState(traitlets.HasTraits):
    """Settings (validated traits) and the recorded history.

    Args:
        total_steps: the number of steps expected (for the progress bar), or ``None``.
        redraw_every: the least number of seconds between two redraws (0: every update).
        target_epsilon: a budget drawn on the epsilon plot, or ``None``.

    Attributes:
        history: ``{metric: ([steps], [values])}``.
        step: the last step recorded (0 before the first).
    """

    total_steps = traitlets.Int(None, allow_none=True)
    redraw_every = traitlets.Float(0.5)
    target_epsilon = traitlets.Float(None, allow_none=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history: dict[str, tuple[list[int], list[float]]] = {m: ([], []) for m in METRICS}
        self.step = 0

    @traitlets.validate("total_steps")
    def _check_total(self, proposal: dict[str, Any]) -> int | None:
        value = proposal["value"]
        return None if value is None else int_at_least("total_steps", value, 1)

    @traitlets.validate("redraw_every")
    def _check_redraw(self, proposal: dict[str, Any]) -> float:
        return non_negative("redraw_every", proposal["value"])

    @traitlets.validate("target_epsilon")
    def _check_target(self, proposal: dict[str, Any]) -> float | None:
        value = proposal["value"]
        return None if value is None else positive("target_epsilon", value)

    def record(self, step: int | None = None, **values: float | None) -> int:
        """Check, then store, the given metrics at ``step`` (default: the last step + 1); ``None`` ones are skipped.

        Returns:
            The step recorded.
        """
        unknown = sorted(set(values) - set(METRICS))
        if unknown:
            refuse(unknown[0], values[unknown[0]], f"unknown metric; use {list(METRICS)}.")
        step = self.step + 1 if step is None else int_at_least("step", step, 0)
        if step < self.step:
            refuse("step", step, f"steps must not go back (the last one was {self.step}).")
        checked = {k: _check(k, v) for k, v in values.items() if v is not None}
        for key, value in checked.items():
            self.history[key][0].append(step)
            self.history[key][1].append(value)
        self.step = step
        return step

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` recorded for ``metric``."""
        return self.history[metric]

    def last(self, metric: str) -> float | None:
        """The last value of ``metric``, or ``None``."""
        ys = self.history[metric][1]
        return ys[-1] if ys else None
