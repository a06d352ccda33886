"""Checks of tutorial 04 (noise and the privacy budget): the smallest σ for ε ≤ 1 (PLD, δ = 1e-5) over 20
epochs of 1438 digits at expected batch 64, and the ε the student computed for it.
"""

from __future__ import annotations

from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, pending, register_check, require

N, BATCH, EPOCHS, DELTA, TARGET = 1438, 64, 20, 1e-5, 1.0
SLACK = 0.95  # σ·0.95 must overshoot the target: the answer is the smallest σ to within 5%


def _epsilon(sigma: float, steps: int) -> float:
    from dpnotebook.privacy import compute_epsilon

    return compute_epsilon(noise_multiplier=sigma, sample_rate=BATCH / N, steps=steps, delta=DELTA, accountant="pld")


@register_check(
    "04.sigma_for_budget",
    todo="find sigma with get_noise_multiplier, then compute its epsilon with "
    "compute_epsilon for the steps 20 epochs run",
)
def check_sigma_for_budget(sigma: Any, epsilon: Any) -> str:
    """σ keeps ε ≤ 1, is the smallest such σ to within 5%, and ``epsilon`` is the accountant's ε for it."""
    from dpnotebook.privacy import steps_for_epochs, steps_per_epoch

    require(
        isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and sigma > 0,
        f"sigma = {sigma!r}: it should be a positive number, the noise multiplier",
    )
    steps = steps_for_epochs(EPOCHS, steps_per_epoch(BATCH / N))
    spent = _epsilon(float(sigma), steps)
    if spent > TARGET:
        raise ExerciseFailed(
            f"σ = {sigma:.2f} spends ε = {spent:.3f} > {TARGET} over the {steps} steps 20 epochs run "
            f"at q = {BATCH}/{N}: pass sample_rate={BATCH}/{N} (not the batch size) and epochs={EPOCHS}"
        )
    if _epsilon(SLACK * float(sigma), steps) <= TARGET:
        raise ExerciseFailed(
            f"σ = {sigma:.2f} gives ε = {spent:.3f}: more noise than needed (σ = {SLACK * sigma:.2f} "
            "also stays within ε ≤ 1). Find the smallest σ, e.g. with get_noise_multiplier"
        )
    pending(epsilon, f"σ = {sigma:.2f} is right; now justify it: its ε from compute_epsilon")
    require(isinstance(epsilon, (int, float)), f"epsilon = {epsilon!r}: it should be the number compute_epsilon gives")
    if abs(epsilon - spent) > 1e-6:
        for wrong in sorted({EPOCHS * N // BATCH, round(EPOCHS * N / BATCH), EPOCHS * -(-N // BATCH), EPOCHS}):
            if abs(epsilon - _epsilon(float(sigma), wrong)) < 1e-6:
                raise ExerciseFailed(
                    f"your ε is for {wrong} steps; a Poisson loader runs {steps} in 20 epochs: "
                    "steps_for_epochs(20, steps_per_epoch(64 / 1438))"
                )
        raise ExerciseFailed(
            f"your ε = {epsilon:.4f}, the accountant's is {spent:.4f} for σ = {sigma:.2f}, "
            f"q = {BATCH}/{N}, {steps} steps, δ = {DELTA} (PLD): check each argument"
        )
    return f"σ = {sigma:.2f} spends ε = {spent:.3f} ≤ 1 over {steps} steps, and {SLACK:.0%} of it would not"
