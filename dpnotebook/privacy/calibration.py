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

from dpnotebook.privacy.accounting import ACCOUNTANTS, compute_epsilon
from dpnotebook.privacy.arguments import (
    check_choice,
    check_delta,
    check_epsilon,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)
from dpnotebook.privacy.schedule import steps_for_epochs
from dpnotebook.privacy.schedule import steps_per_epoch as poisson_steps_per_epoch

__all__ = ["get_noise_multiplier"]


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
            raise ValueError(f"target_epsilon={target!r} cannot be reached with noise_multiplier <= 1e6.")
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
