"""Refusing bad values with a message that names the argument and the value.

Every check raises :class:`WidgetValueError`, which is both a ``ValueError``
(what the rest of dpnotebook raises) and a ``traitlets.TraitError`` (what a
``@validate`` handler is expected to raise).

>>> positive("max_grad_norm", 0.0)
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: max_grad_norm=0.0 is invalid: it must be a number > 0.
>>> open_unit("delta", 1e-5)
1e-05
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import traitlets

T = TypeVar("T")

__all__ = [
    "WidgetValueError",
    "refuse",
    "library_check",
    "positive",
    "non_negative",
    "open_unit",
    "unit_interval",
    "int_at_least",
    "one_of",
]


class WidgetValueError(traitlets.TraitError, ValueError):
    """A value a widget refuses; the message names the argument and the value."""


WidgetValueError.__module__ = "dpnotebook.widgets"


def library_check(check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one of dpnotebook's own argument checks, re-raising its ``ValueError`` as :class:`WidgetValueError`.

    The widgets then refuse exactly what the training code refuses, with the same message.

    >>> from dpnotebook.grad_sample._engine.hooks import check_k
    >>> library_check(check_k, 0)
    Traceback (most recent call last):
    ...
    dpnotebook.widgets.WidgetValueError: K=0 is invalid: K is the number of augmented copies ...
    """
    try:
        return check(*args, **kwargs)
    except WidgetValueError:
        raise
    except ValueError as exc:
        raise WidgetValueError(str(exc)) from exc


def refuse(name: str, value: Any, why: str) -> None:
    """Raise :class:`WidgetValueError` for ``name=value``, explaining ``why``."""
    raise WidgetValueError(f"{name}={value!r} is invalid: {why}")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        refuse(name, value, "it must be a real number.")
    return float(value)


def positive(name: str, value: Any) -> float:
    """``value`` as a float, refused unless finite and ``> 0``."""
    v = _number(name, value)
    if not (v > 0 and math.isfinite(v)):
        refuse(name, value, "it must be a number > 0.")
    return v


def non_negative(name: str, value: Any) -> float:
    """``value`` as a float, refused unless finite and ``>= 0``."""
    v = _number(name, value)
    if not (v >= 0 and math.isfinite(v)):
        refuse(name, value, "it must be a number >= 0.")
    return v


def open_unit(name: str, value: Any) -> float:
    """``value`` as a float, refused unless ``0 < value < 1``."""
    v = _number(name, value)
    if not 0 < v < 1:
        refuse(name, value, "it must lie strictly between 0 and 1.")
    return v


def unit_interval(name: str, value: Any) -> float:
    """``value`` as a float, refused unless ``0 <= value <= 1``."""
    v = _number(name, value)
    if not 0 <= v <= 1:
        refuse(name, value, "it must lie between 0 and 1.")
    return v


def int_at_least(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int, refused unless ``low <= value`` (and ``<= high`` if given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            refuse(name, value, "it must be an integer.")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        refuse(name, value, f"it must be an integer {bound}.")
    return int(value)


def one_of(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` itself, refused unless it is one of ``choices``."""
    if value not in choices:
        refuse(name, value, f"choose one of {list(choices)}.")
    return value
