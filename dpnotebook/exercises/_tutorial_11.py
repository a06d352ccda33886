"""Checks of tutorial 11 (public pretraining): ε of pretraining on the "public" digits, of the pipeline with
disjoint people (parallel composition) and with the same people (sequential, one accountant for both phases).
"""

from __future__ import annotations

import functools
from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, close, pending, register_check, require

SIGMA_PRE, BATCH_PRE, EPOCHS_PRE, DELTA = 4.0, 64, 20, 1e-5


def _pretraining(n_public: int) -> tuple[float, int]:
    """The ε and the steps of DP pretraining on the public part."""
    from dpnotebook.privacy import compute_epsilon, steps_for_epochs, steps_per_epoch

    q = BATCH_PRE / n_public
    steps = steps_for_epochs(EPOCHS_PRE, steps_per_epoch(q))
    return compute_epsilon(noise_multiplier=SIGMA_PRE, sample_rate=q, steps=steps, delta=DELTA), steps


_close = functools.partial(close, rel=2e-3)


@register_check(
    "11.not_public",
    todo="compute epsilon_pretrain, epsilon_disjoint and epsilon_same_people (one accountant for two phases)",
)
def check_not_public(answer: Any, fine_tune: Any, n_public: int, n_private: int) -> str:
    """``answer = (epsilon_pretrain, epsilon_disjoint, epsilon_same_people)`` against the accountant."""
    from dpnotebook.privacy import compute_epsilon, create_accountant

    require(
        isinstance(answer, tuple) and len(answer) == 3,
        "the check takes the tuple (epsilon_pretrain, epsilon_disjoint, epsilon_same_people)",
    )
    pre, disjoint, same = answer
    q_ft = fine_tune.setting.batch_size / n_private
    eps_ft = compute_epsilon(
        noise_multiplier=fine_tune.noise_multiplier, sample_rate=q_ft, steps=fine_tune.steps, delta=DELTA
    )
    want_pre, steps_pre = _pretraining(n_public)
    pending(pre, "start with epsilon_pretrain: compute_epsilon for the pretraining run")
    require(isinstance(pre, float), f"epsilon_pretrain = {pre!r}: it should be a number (a float)")
    if _close(
        pre,
        compute_epsilon(
            noise_multiplier=SIGMA_PRE, sample_rate=BATCH_PRE / (n_public + n_private), steps=steps_pre, delta=DELTA
        ),
    ):
        raise ExerciseFailed(
            f"q is the chance that one public digit is in a batch: {BATCH_PRE} / {n_public} (the public part), "
            "not the whole training set"
        )
    require(
        _close(pre, want_pre),
        f"epsilon_pretrain = {pre:.4g} is not the ε of {EPOCHS_PRE} epochs at σ = {SIGMA_PRE:g} and "
        f"q = {BATCH_PRE}/{n_public}: a Poisson loader runs steps_per_epoch(q) steps per epoch",
    )
    pending(disjoint, "epsilon_pretrain is right; now epsilon_disjoint")
    require(isinstance(disjoint, float), f"epsilon_disjoint = {disjoint!r}: it should be a number (a float)")
    if _close(disjoint, pre + eps_ft):
        raise ExerciseFailed(
            "epsilon_disjoint adds the two ε's; but a person in only one part is touched by only one phase "
            "(the other phase sees none of their data, and using the first phase's model is post-processing). "
            "Which person is protected least?"
        )
    if _close(disjoint, eps_ft) and eps_ft < want_pre:
        raise ExerciseFailed(
            f"{eps_ft:.2f} protects the people in the private part; the people in the pretraining part "
            "are protected by pretraining's ε alone"
        )
    require(
        _close(disjoint, max(want_pre, eps_ft)),
        "epsilon_disjoint: each person is in one part, so their ε is that of the one phase that sees them; "
        "the pipeline's guarantee is the worst over all people",
    )
    pending(same, "epsilon_disjoint is right; now epsilon_same_people")
    require(isinstance(same, float), f"epsilon_same_people = {same!r}: it should be a number (a float)")
    accountant = create_accountant("pld")
    accountant.step(noise_multiplier=SIGMA_PRE, sample_rate=BATCH_PRE / n_public, num_steps=steps_pre)
    accountant.step(noise_multiplier=fine_tune.noise_multiplier, sample_rate=q_ft, num_steps=fine_tune.steps)
    want_same = accountant.get_epsilon(DELTA)
    if _close(same, disjoint):
        raise ExerciseFailed(
            "that is the disjoint case; when the same person is in both parts, both phases see them: compose them"
        )
    if _close(same, pre + eps_ft) and not _close(same, want_same):
        raise ExerciseFailed(
            "adding the two ε's bounds the pipeline only at twice the δ (basic composition adds the δ's too), "
            "and loosely: let one accountant compose both phases "
            "(create_accountant('pld'), one .step(...) per phase with its σ, q and steps, then .get_epsilon)"
        )
    require(
        _close(same, want_same),
        f"epsilon_same_people = {same:.4g}: one accountant, a step call per phase (pretraining: σ = {SIGMA_PRE:g}, "
        f"q = {BATCH_PRE}/{n_public}; fine-tune: the σ, q and steps of results['last'][0]), at δ = {DELTA:g}",
    )
    return (
        f"pretraining alone ε = {pre:.2f}; disjoint people ε = {disjoint:.2f}; the same people ε = {same:.2f} "
        f"(not {pre + eps_ft:.2f})"
    )
