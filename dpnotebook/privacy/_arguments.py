"""Checks for the privacy arguments, with errors that name the argument, its value and the fix.

>>> check_noise_multiplier(-1)
Traceback (most recent call last):
...
ValueError: noise_multiplier=-1 is invalid: it must be a number >= 0 (...). Fix: pass e.g. noise_multiplier=1.0; ...
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any


def _number(name: str, value: Any, ok: Callable[[float], bool], rule: str) -> float:
    """``value`` as a float if it is a real number (not a bool, not NaN) that is ``ok``; else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or not ok(float(value)):
        raise ValueError(f"{name}={value!r} is invalid: it must be {rule}")
    return float(value)


def check_noise_multiplier(value: Any) -> float:
    """``noise_multiplier`` (sigma) as a float; it must be >= 0."""
    return _number(
        "noise_multiplier",
        value,
        lambda v: 0 <= v < math.inf,
        "a number >= 0 (the noise std is noise_multiplier * max_grad_norm). Fix: pass e.g. "
        "noise_multiplier=1.0; 0 means no noise and no privacy.",
    )


def check_max_grad_norm(value: Any) -> float:
    """``max_grad_norm`` (the clipping bound C) as a float; it must be > 0 (``math.inf`` is allowed)."""
    return _number(
        "max_grad_norm",
        value,
        lambda v: v > 0,
        "a number > 0 (each sample's gradient is scaled down to norm <= max_grad_norm). Fix: pass e.g. "
        "max_grad_norm=1.0.",
    )


def check_sample_rate(value: Any) -> float:
    """``sample_rate`` q as a float in (0, 1]."""
    return _number(
        "sample_rate",
        value,
        lambda v: 0 < v <= 1,
        "in (0, 1] (the probability that a sample is in a batch, expected_batch_size / dataset_size). "
        "Fix: pass e.g. sample_rate=256 / 60000.",
    )


def check_delta(value: Any, *, dataset_size: int | None = None, name: str = "delta") -> float:
    """``delta`` as a float in (0, 1); warn when it is not below ``1 / dataset_size``."""
    fix = f"Fix: pass e.g. {name}=1e-5, well below 1 / dataset size."
    value = _number(
        name, value, lambda v: 0 < v < 1, f"in (0, 1) (the probability that the epsilon guarantee fails). {fix}"
    )
    if dataset_size is not None and dataset_size > 0 and value >= 1 / dataset_size:
        suggestion = 10 ** math.floor(math.log10(0.01 / dataset_size))
        warnings.warn(
            f"{name}={value!r} is >= 1/N = 1/{dataset_size}: such a {name} allows leaking a whole "
            f"record. Fix: use {name} well below 1/N, e.g. {name}={suggestion:g}.",
            UserWarning,
            stacklevel=3,
        )
    return value


def check_epsilon(value: Any, *, name: str = "target_epsilon") -> float:
    """A target epsilon as a float > 0."""
    return _number(name, value, lambda v: 0 < v < math.inf, f"a finite number > 0. Fix: pass e.g. {name}=8.0.")


def check_unseeded(name: str, generator: Any, secure: bool, flag: str = "secure_mode") -> None:
    """Refuse a ``generator`` with secure randomness: a seeded generator is predictable."""
    if secure and generator is not None:
        raise ValueError(
            f"{name}={generator!r} with {flag}=True: a seeded generator is predictable. Fix: pass {name}=None, "
            f"or {flag}=False to reproduce a run."
        )


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` that lists them."""
    options = sorted(choices)
    if value not in options:
        raise ValueError(f"{name}={value!r} is unknown; choose one of {options}.")
    return value


def check_positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: it must be an int >= {minimum}.")
    return int(value)


def check_positive_number(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number > 0."""
    return _number(name, value, lambda v: 0 < v < math.inf, "a finite number > 0.")
