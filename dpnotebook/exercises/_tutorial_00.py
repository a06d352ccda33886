"""Checks of tutorial 00 (quickstart): train again within ε ≤ 2; the answer is the second run's engine."""

from __future__ import annotations

from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, register_check, require

TARGET, DELTA = 2.0, 1e-5


@register_check(
    "00.smaller_budget",
    todo="copy the private run above into the exercise cell with "
    "target_epsilon=2.0, as engine2 / optimizer2, and train it",
)
def check_smaller_budget(
    engine2: Any, optimizer2: Any = None, first_engine: Any = None, first_optimizer: Any = None
) -> str:
    """The second run spent at most ε = 2 over as many steps as the first, with more noise."""
    from dpnotebook.privacy import PrivacyEngine

    require(
        isinstance(engine2, PrivacyEngine),
        f"engine2 is a {type(engine2).__name__}: make it the PrivacyEngine "
        'of the new run (engine2 = PrivacyEngine(accountant="pld"))',
    )
    steps = len(engine2.accountant)
    require(steps > 0, "the accountant counted no step: call make_private_with_epsilon, then train with fit(...)")
    if first_engine is not None and steps != len(first_engine.accountant):
        raise ExerciseFailed(
            f"the new run took {steps} steps, the first {len(first_engine.accountant)}: train for "
            "the same 30 epochs (epochs=30 in make_private_with_epsilon and in fit)"
        )
    spent = engine2.get_epsilon(DELTA)
    if spent > TARGET:
        raise ExerciseFailed(
            f"ε = {spent:.2f} > 2: pass target_epsilon=2.0 (and the same epochs) to "
            "make_private_with_epsilon, which then picks the noise"
        )
    if spent < 0.9 * TARGET:
        raise ExerciseFailed(
            f"ε = {spent:.2f}, well under 2: that much noise is not needed; let "
            "make_private_with_epsilon(target_epsilon=2.0, ...) choose it"
        )
    sigma2 = getattr(optimizer2, "noise_multiplier", None)
    require(sigma2 is not None, "optimizer2 should be the optimizer make_private_with_epsilon returned")
    if first_optimizer is not None:
        require(
            sigma2 > first_optimizer.noise_multiplier,
            f"σ = {sigma2:.2f} is not above the first run's "
            f"{first_optimizer.noise_multiplier:.2f}: is optimizer2 the new run's optimizer?",
        )
        return (
            f"ε = {spent:.2f} ≤ 2 over {steps} steps; σ went from {first_optimizer.noise_multiplier:.2f} "
            f"to {sigma2:.2f}"
        )
    return f"ε = {spent:.2f} ≤ 2 over {steps} steps with σ = {sigma2:.2f}"
