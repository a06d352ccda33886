"""Calibration: the noise multiplier that a privacy budget allows.

The inverse of :func:`~dpnotebook.privacy.accounting.compute_epsilon`: given a
target ``(epsilon, delta)``, a sampling rate and a number of steps, find the
smallest ``sigma`` whose epsilon stays within the target. Epsilon falls as
sigma grows, so a bracket and a bisection find it; every epsilon on the way
comes from ``dp_accounting``, and the answer is a sigma whose epsilon was
computed and found within budget.

>>> sigma = get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=0.01, epochs=1)
>>> compute_epsilon(noise_multiplier=sigma, sample_rate=0.01, steps=100, delta=1e-5) <= 8.0
True
"""

from __future__ import annotations

import functools
import math
import warnings

from dpnotebook.errors import PrivacyWarning
from dpnotebook.privacy._arguments import (
    check_choice,
    check_delta,
    check_epsilon,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)
from dpnotebook.privacy.accounting import ACCOUNTANTS, compute_epsilon
from dpnotebook.privacy.schedule import steps_for_epochs
from dpnotebook.privacy.schedule import steps_per_epoch as poisson_steps_per_epoch

__all__ = ["get_noise_multiplier", "warn_if_noise_drowns_signal"]

#: What to change when a budget cannot be met, or only with noise that drowns the signal.
FIX_BUDGET = (
    "Fix: use more data (a smaller sample rate q = B/N for the same batch), fewer epochs (fewer steps), "
    "or a larger target_epsilon."
)


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int | None = None,
    epochs: float | None = None,
    steps_per_epoch: int | None = None,
    accountant: str = "pld",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The smallest noise multiplier (within tolerance) whose epsilon is at most ``target_epsilon``.

    Brackets sigma by doubling or halving from 1, then bisects; the answer is
    always a sigma whose epsilon was computed and found ``<= target_epsilon``,
    and ``>= target_epsilon - epsilon_tolerance`` unless the search interval
    became tiny. Results are cached, so repeated queries (a slider) are instant.

    Args:
        target_epsilon: the privacy budget epsilon (> 0).
        target_delta: the delta in (0, 1).
        sample_rate: q, the probability that a sample is in a batch.
        steps: the number of steps; or give ``epochs``.
        epochs: the number of epochs, instead of ``steps``: ``steps = ceil(epochs * steps_per_epoch)``
            (:func:`~dpnotebook.privacy.schedule.steps_for_epochs`), the steps the loader will run.
        steps_per_epoch: batches per epoch (default: a Poisson loader's ``round(1 / q)``); pass
            ``len(data_loader)`` to calibrate for the loader you train with.
        accountant: a registry name (``"pld"``, ``"prv"``, ``"rdp"``).
        epsilon_tolerance: how far below the target epsilon may end (> 0).

    >>> sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01, steps=100)
    >>> round(sigma, 2)
    0.9
    >>> compute_epsilon(noise_multiplier=sigma, sample_rate=0.01, steps=100, delta=1e-5) <= 1.0
    True
    """
    target_epsilon = check_epsilon(target_epsilon)
    target_delta = check_delta(target_delta, name="target_delta")
    sample_rate = check_sample_rate(sample_rate)
    tolerance = check_positive_number("epsilon_tolerance", epsilon_tolerance)
    check_choice("accountant", accountant, ACCOUNTANTS)
    if (steps is None) == (epochs is None):
        raise ValueError(f"steps={steps!r}, epochs={epochs!r}: give exactly one of them.")
    if steps is None:
        assert epochs is not None  # exactly one of steps and epochs was given
        per_epoch = poisson_steps_per_epoch(sample_rate) if steps_per_epoch is None else steps_per_epoch
        steps = steps_for_epochs(epochs, per_epoch)
    elif steps_per_epoch is not None:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r} goes with epochs=, not with steps={steps!r}.")
    steps = check_positive_int("steps", steps)
    return _search_noise_multiplier(target_epsilon, target_delta, sample_rate, steps, accountant, tolerance)


@functools.lru_cache(maxsize=1024)
def _search_noise_multiplier(
    target: float, delta: float, q: float, steps: int, accountant: str, tolerance: float
) -> float:
    def epsilon(sigma: float) -> float:
        return compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant=accountant)

    low, high = 1.0, 1.0  # invariant: eps(low) > target >= eps(high)
    eps_high = epsilon(high)
    while eps_high > target:
        low, high = high, 2 * high
        if high > 1e6:
            raise ValueError(
                f"target_epsilon={target!r} (delta={delta:g}) cannot be reached with q={q:.4g} and {steps} "
                f"steps: even noise_multiplier=1e6 spends more. {FIX_BUDGET}"
            )
        eps_high = epsilon(high)
    if low == high:
        low = high / 2
        while epsilon(low) <= target:
            high, low = low, low / 2
            if low < 1e-3:
                raise ValueError(f"target_epsilon={target!r} is reached without noise; pick a smaller target.")
        eps_high = epsilon(high)
    while target - eps_high > tolerance and high - low > 1e-9 * high:
        mid = (low + high) / 2
        eps_mid = epsilon(mid)
        if eps_mid > target:
            low = mid
        else:
            high, eps_high = mid, eps_mid
    assert eps_high <= target and math.isfinite(high)
    return high


def warn_if_noise_drowns_signal(noise_multiplier: float, expected_batch_size: float) -> None:
    """Warn (:class:`~dpnotebook.errors.PrivacyWarning`) when the noise leaves nothing to learn from.

    DP-SGD adds noise of std ``sigma * C`` per coordinate to the sum of at most ``B`` clipped
    gradients, each of norm at most ``C``, and divides by ``B``. With ``sigma > B`` the noise on
    every single coordinate of the averaged gradient has a larger std than the *whole* clipped
    signal's norm can reach (``C``): the model moves at random and training learns nothing,
    although the privacy guarantee holds. :meth:`PrivacyEngine.make_private
    <dpnotebook.privacy.PrivacyEngine.make_private>` calls it for every run, so a sigma
    calibrated for an out-of-reach budget (say 65,536) is said, not silently returned.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_noise_drowns_signal(65536.0, expected_batch_size=128)
    ...     warn_if_noise_drowns_signal(1.1, expected_batch_size=128)   # a usual sigma: silent
    >>> len(caught)
    1
    >>> print(caught[0].message)
    noise_multiplier=65536 with an expected batch of 128 samples: ... sigma*C/B = 512*C on every
    coordinate, ... so training will learn nothing (the guarantee holds). Fix: use more data ...
    """
    if noise_multiplier > expected_batch_size > 0:
        warnings.warn(
            f"noise_multiplier={noise_multiplier:.6g} with an expected batch of {expected_batch_size:.6g} "
            f"samples: the noise on the averaged gradient has std sigma*C/B = "
            f"{noise_multiplier / expected_batch_size:.3g}*C on every coordinate, more than the whole "
            f"clipped signal can reach (norm <= C), so training will learn nothing (the guarantee holds). "
            f"{FIX_BUDGET}",
            PrivacyWarning,
            stacklevel=3,
        )
