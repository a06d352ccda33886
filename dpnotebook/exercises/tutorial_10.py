"""Checkers for tutorial 10 (tuning at a fixed budget).

``10.noise_on_average``: the student's ``noise_std_on_average(batch_size, *, epsilon,
epochs, C, N, delta)`` must give ``sigma * C / B`` with ``sigma`` from the accountant
(:func:`~dpnotebook.privacy.calibration.get_noise_multiplier` at ``q = B / N`` for the
steps ``epochs`` epochs of a Poisson loader run); compared for a few settings.

>>> from dpnotebook.privacy import get_noise_multiplier
>>> def solution(batch_size, *, epsilon, epochs, C, N, delta):
...     sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=batch_size / N,
...                                  epochs=epochs)
...     return sigma * C / batch_size
>>> check_noise_on_average(solution)                              # doctest: +ELLIPSIS
'sigma*C/B matches the accountant...'
"""

from __future__ import annotations

import math
from typing import Callable

from dpnotebook.exercises.core import ExerciseFailed, register_check, require
from dpnotebook.privacy.calibration import get_noise_multiplier

__all__ = ["check_noise_on_average"]

N, DELTA = 1438, 1e-5
CASES = [(64, 2.0, 5, 0.5), (256, 1.0, 8, 1.0), (16, 4.0, 3, 2.0)]  # B, epsilon, epochs, C


def _sigma(B: int, epsilon: float, epochs: float) -> float:
    return get_noise_multiplier(target_epsilon=epsilon, target_delta=DELTA, sample_rate=B / N, epochs=epochs)


@register_check(
    "10.noise_on_average",
    todo="write noise_std_on_average: sigma from get_noise_multiplier at q = B / N for the epochs, then sigma * C / B",
)
def check_noise_on_average(noise_std_on_average: Callable) -> str:
    """Compare with ``sigma * C / B`` for three settings, and name the common mistakes."""
    for B, epsilon, epochs, C in CASES:
        got = noise_std_on_average(B, epsilon=epsilon, epochs=epochs, C=C, N=N, delta=DELTA)
        require(isinstance(got, (int, float)) or hasattr(got, "item"), f"return a number, got {type(got).__name__}")
        got = float(got)
        sigma = _sigma(B, epsilon, epochs)
        want = sigma * C / B
        if math.isclose(got, want, rel_tol=0.02):
            continue
        wrong = {
            "that is sigma * C: divide by the batch size B (the noise is added to the sum of B gradients)": sigma * C,
            "that is sigma / B: the noise std on the sum is sigma * C, so on the average sigma * C / B": sigma / B,
            "that is sigma itself: the noise on the average is sigma * C / B": sigma,
            "you divided by N: the sum is divided by the expected batch size B = q * N": sigma * C / N,
            "sigma looks calibrated for one epoch: pass epochs= (or the steps that many epochs run)": _sigma(
                B, epsilon, 1
            )
            * C
            / B,
        }
        for hint, value in wrong.items():
            if math.isclose(got, value, rel_tol=0.02):
                raise ExerciseFailed(hint)
        raise ExerciseFailed(
            f"for B={B}, epsilon={epsilon}, {epochs} epochs, C={C}: got {got:.4g}, expected sigma*C/B = {want:.4g} "
            f"(sigma = {sigma:.3f} from get_noise_multiplier with sample_rate=B/N)"
        )
    best = min((16, 64, 256), key=lambda B: _sigma(B, 1.0, 8) * 1.0 / B)
    return f"sigma*C/B matches the accountant; at epsilon = 1, 8 epochs, B = {best} gives the least noisy average"
