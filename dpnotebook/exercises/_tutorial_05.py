"""Checks of tutorial 05 (augmentation multiplicity): the steps and ε of a K = 16, 50-epoch run, computed before
training; the hints recognise the usual slips (the 25-epoch ε, steps or q times K, ε doubled).
"""

from __future__ import annotations

import math
from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, pending, register_check, require

SIGMA, BATCH, N, DELTA = 1.2, 128, 1438, 1e-5
EPOCHS, RUN_EPOCHS, K = 50, 25, 16


def _epsilon(sample_rate: float, steps: int) -> float:
    from dpnotebook.privacy import compute_epsilon

    return compute_epsilon(noise_multiplier=SIGMA, sample_rate=sample_rate, steps=steps, delta=DELTA)


@register_check(
    "05.epsilon_any_K",
    todo=f"count the steps a run of {EPOCHS} epochs with K = {K} takes, then compute the ε it would spend",
)
def check_epsilon_any_k(my_epsilon: Any, steps: Any) -> str:
    """``steps`` and ``my_epsilon`` of the K = 16, 50-epoch run, computed from σ, q and the steps alone."""
    from dpnotebook.privacy import steps_per_epoch

    per_epoch = steps_per_epoch(BATCH / N)
    want_steps = EPOCHS * per_epoch
    pending(steps, f"count the steps first: {EPOCHS} epochs of len(loader) batches")
    require(isinstance(steps, int), f"steps = {steps!r}: it should be a whole number of steps")
    if steps == RUN_EPOCHS * per_epoch:
        raise ExerciseFailed(
            f"{steps} steps is what the runs above took ({RUN_EPOCHS} epochs); the question is {EPOCHS}"
        )
    if steps in (K * want_steps, 4 * want_steps):
        raise ExerciseFailed(
            "the K copies of a sample are rows of the SAME batch: they add no step. One step per batch of "
            "the Poisson loader, len(loader) batches per epoch"
        )
    if steps in (EPOCHS * N // BATCH, math.ceil(EPOCHS * N / BATCH)):
        raise ExerciseFailed(
            f"{steps} is {EPOCHS}·N/B: a Poisson loader runs len(loader) = {per_epoch} batches per epoch, so count "
            "from that"
        )
    require(steps == want_steps, f"steps = {steps}: the run takes {EPOCHS} epochs of len(loader) batches each")
    pending(my_epsilon, "steps is right; now compute the ε of that run with dpnotebook.compute_epsilon")
    require(isinstance(my_epsilon, float), f"my_epsilon = {my_epsilon!r}: it should be a number (a float)")
    run_epsilon = _epsilon(BATCH / N, RUN_EPOCHS * per_epoch)
    if abs(my_epsilon - run_epsilon) < 1e-6:
        raise ExerciseFailed(
            f"{my_epsilon:.2f} is what the runs above spent in {RUN_EPOCHS} epochs (engine.get_epsilon); "
            f"this run is twice as long"
        )
    if abs(my_epsilon - 2 * run_epsilon) < 1e-6:
        raise ExerciseFailed(
            "twice the ε of 25 epochs bounds the run only at twice the δ (basic composition adds the δ's too), "
            "and loosely: the accountant composes the steps far more tightly. Ask it for the whole run"
        )
    for k in (2, 4):  # K = 16 times q is above 1: compute_epsilon refuses it with its own message
        if abs(my_epsilon - _epsilon(k * BATCH / N, steps)) < 1e-9:
            raise ExerciseFailed(
                f"that is the ε of a sample rate K·{BATCH}/{N}: the accountant counts samples, not "
                f"rows, so q = {BATCH}/{N} whatever K is"
            )
    want = _epsilon(BATCH / N, steps)
    require(
        abs(my_epsilon - want) < 1e-6,
        f"my_epsilon = {my_epsilon:.4f} is not the ε of {steps} steps of the subsampled Gaussian mechanism with "
        f"σ = {SIGMA} and q = {BATCH}/{N} at δ = {DELTA:g} (PLD accountant)",
    )
    return (
        f"{steps} steps, ε = {my_epsilon:.2f}: K appears nowhere, and twice the epochs cost less than twice "
        f"the ε ({run_epsilon:.2f} for {RUN_EPOCHS})"
    )
