"""Checks of tutorial 05 (augmentation multiplicity): ε does not depend on K.

The answer is the ε the student computed with :func:`dpnotebook.compute_epsilon` from σ, q and
the number of steps; the check compares it with what the run's own accountant reports, and
recognises the usual slips (steps counted from the dataset size, a sample rate multiplied by K).

>>> from dpnotebook.exercises import judge
>>> from dpnotebook.privacy import compute_epsilon
>>> wrong = compute_epsilon(noise_multiplier=1.2, sample_rate=4 * 128 / 1438, steps=275, delta=1e-5)
>>> judge("05.epsilon_any_K", wrong, steps=275, expected_epsilon=7.5, expected_steps=275).hint
'that is the ε of a sample rate K·128/1438: the accountant counts samples, not rows, so q = 128/1438 whatever K is'
"""

from __future__ import annotations

from typing import Any

from dpnotebook.exercises.core import ExerciseFailed, NotYetSolved, is_stub, register_check, require

SIGMA, BATCH, N, DELTA = 1.2, 128, 1438, 1e-5


def _epsilon(sample_rate: float, steps: int) -> float:
    from dpnotebook.privacy import compute_epsilon

    return compute_epsilon(noise_multiplier=SIGMA, sample_rate=sample_rate, steps=steps, delta=DELTA)


@register_check(
    "05.epsilon_any_K",
    todo="count the steps the runs took (epochs × len(loader)), then compute_epsilon with sigma 1.2 and q = 128/1438",
)
def check_epsilon_any_k(my_epsilon: Any, steps: Any, expected_epsilon: float, expected_steps: int) -> str:
    """``my_epsilon`` equals the runs' ε (``expected_epsilon``), from ``expected_steps`` steps at q = 128/1438."""
    if is_stub(steps):
        raise NotYetSolved("count the steps first: 25 epochs of len(loader) batches")
    require(isinstance(steps, int), f"steps = {steps!r}: it should be a whole number of steps")
    if steps != expected_steps:
        raise ExerciseFailed(
            f"steps = {steps}, but the runs took {expected_steps}: a Poisson loader runs "
            "len(loader) batches per epoch, whatever K is; 25 epochs are 25 * len(loader)"
        )
    require(
        isinstance(my_epsilon, float), f"my_epsilon = {my_epsilon!r}: it should be the number compute_epsilon gives"
    )
    for K in (2, 4):
        if abs(my_epsilon - _epsilon(K * BATCH / N, steps)) < 1e-9:
            raise ExerciseFailed(
                f"that is the ε of a sample rate K·{BATCH}/{N}: the accountant counts samples, not "
                f"rows, so q = {BATCH}/{N} whatever K is"
            )
    require(
        abs(my_epsilon - expected_epsilon) < 1e-6,
        f"my_epsilon = {my_epsilon:.4f}, the runs spent "
        f"{expected_epsilon:.4f}: use noise_multiplier={SIGMA}, sample_rate={BATCH}/{N}, steps={steps}, delta={DELTA}",
    )
    return f"ε = {my_epsilon:.2f} from σ, q and {steps} steps alone: the same for K = 1 and K = 4"
