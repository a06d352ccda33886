"""Refusing bad values with a message that names the argument and the value (and the states' cache).

Every check raises :class:`WidgetValueError`, both a ``ValueError`` (what the rest of
dpnotebook raises) and a ``traitlets.TraitError`` (what a ``@validate`` handler raises).

>>> positive("max_grad_norm", 0.0)
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: max_grad_norm=0.0 is invalid: it must be a number > 0.
>>> open_unit("delta", 1e-5)
1e-05
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import traitlets

from dpnotebook.privacy._arguments import check_delta, check_max_grad_norm, check_noise_multiplier

T = TypeVar("T")


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


def _number(name: str, value: Any, ok: Callable[[float], bool], why: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        refuse(name, value, "it must be a real number.")
    if not ok(float(value)):
        refuse(name, value, why)
    return float(value)


def positive(name: str, value: Any) -> float:
    """``value`` as a float, refused unless finite and ``> 0``."""
    return _number(name, value, lambda v: 0 < v < math.inf, "it must be a number > 0.")


def non_negative(name: str, value: Any) -> float:
    """``value`` as a float, refused unless finite and ``>= 0``."""
    return _number(name, value, lambda v: 0 <= v < math.inf, "it must be a number >= 0.")


def open_unit(name: str, value: Any) -> float:
    """``value`` as a float, refused unless ``0 < value < 1``."""
    return _number(name, value, lambda v: 0 < v < 1, "it must lie strictly between 0 and 1.")


def unit_interval(name: str, value: Any) -> float:
    """``value`` as a float, refused unless ``0 <= value <= 1``."""
    return _number(name, value, lambda v: 0 <= v <= 1, "it must lie between 0 and 1.")


def int_at_least(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int, refused unless ``low <= value`` (and ``<= high`` if given)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(name, value, "it must be an integer.")
    if value < low or (high is not None and value > high):
        refuse(name, value, f"it must be an integer {f'>= {low}' if high is None else f'between {low} and {high}'}.")
    return int(value)


def one_of(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` itself, refused unless it is one of ``choices``."""
    if value not in choices:
        refuse(name, value, f"choose one of {list(choices)}.")
    return value


def noisy_sigma(value: Any) -> float:
    """``noise_multiplier`` as the library checks it, refused at 0 (epsilon would be infinite)."""
    sigma = library_check(check_noise_multiplier, value)
    if sigma == 0:
        refuse("noise_multiplier", value, "without noise epsilon is infinite; use sigma > 0.")
    return sigma


def quiet_delta(value: Any) -> float:
    """``delta`` as the library checks it, without its warnings (a widget shows its own note)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return library_check(check_delta, value)


def finite_c(value: Any) -> float:
    """``max_grad_norm`` as the library checks it, refused when infinite (the widgets draw C)."""
    c = library_check(check_max_grad_norm, value)
    if math.isinf(c):
        refuse("max_grad_norm", value, "the widget needs a finite bound C.")
    return c


def bounded_cache(cache: dict[Any, Any], key: Any, compute: Callable[[], T], limit: int = 256) -> T:
    """``cache[key]``, computed by ``compute()`` the first time; the cache is emptied past ``limit`` entries."""
    if key not in cache:
        if len(cache) > limit:
            cache.clear()
        cache[key] = compute()
    return cache[key]
