"""Checks of tutorial 10 (tuning at a fixed budget): the noise std on the average, ``sigma * C / B``, at a fixed
number of steps, and how many times noisier B = 64 is than B = 256. The success message keeps the conclusion.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, pending, register_check, require, spot_slip
from dpnotebook.privacy import get_noise_multiplier

N, DELTA = 1438, 1e-5
CASES = [(64, 2.0, 60, 0.5), (256, 1.0, 40, 1.0), (16, 4.0, 100, 2.0)]  # B, epsilon, steps, C
QUESTION = (1.0, 180, 1.0)  # epsilon, steps, C of the ratio std(B = 64) / std(B = 256)


def _sigma(B: int, epsilon: float, steps: int | None = None, epochs: float | None = None) -> float:
    return get_noise_multiplier(
        target_epsilon=epsilon, target_delta=DELTA, sample_rate=B / N, steps=steps, epochs=epochs
    )


def _std(B: int, epsilon: float, steps: int, C: float) -> float:
    return _sigma(B, epsilon, steps=steps) * C / B


@register_check(
    "10.noise_on_average",
    todo="write noise_std_at_fixed_steps(batch_size, *, epsilon, steps, C, N, delta); then compute advantage",
)
def check_noise_on_average(noise_std_at_fixed_steps: Callable[..., Any], advantage: Any = None) -> str:
    """Compare with ``sigma * C / B`` for three settings, then the ratio; name the common mistakes."""
    for B, epsilon, steps, C in CASES:
        got = noise_std_at_fixed_steps(B, epsilon=epsilon, steps=steps, C=C, N=N, delta=DELTA)
        require(isinstance(got, (int, float)) or hasattr(got, "item"), f"return a number, got {type(got).__name__}")
        got = float(got)
        sigma = _sigma(B, epsilon, steps=steps)
        want = sigma * C / B
        if math.isclose(got, want, rel_tol=0.02):
            continue
        slips = [
            (sigma * C, "that is sigma * C: divide by the batch size B (the noise is added to the sum of B gradients)"),
            (sigma / B, "that is sigma / B: the noise std on the sum is sigma * C, so on the average sigma * C / B"),
            (sigma, "that is sigma itself: the noise on the average is sigma * C / B"),
            (sigma * C / N, "you divided by N: the sum is divided by the expected batch size B = q * N"),
            (
                _sigma(B, epsilon, epochs=steps) * C / B,
                "sigma looks calibrated for `steps` EPOCHS: pass steps=steps to get_noise_multiplier, not epochs=",
            ),
            (
                _sigma(B, epsilon, epochs=1) * C / B,
                "sigma looks calibrated for one epoch: the run takes `steps` steps, pass steps=steps",
            ),
        ]
        spot_slip(got, slips, want, rel=0.02)
        raise ExerciseFailed(
            f"for B={B}, epsilon={epsilon}, {steps} steps, C={C}: got {got:.4g}, expected sigma*C/B = {want:.4g} "
            f"(sigma = {sigma:.3f} from get_noise_multiplier with sample_rate=B/N and steps={steps})"
        )
    pending(advantage, "the function is right; now compute advantage = std at B = 64 / std at B = 256")
    require(isinstance(advantage, (int, float)), f"advantage should be a number, got {type(advantage).__name__}")
    epsilon, steps, C = QUESTION
    want_ratio = _std(64, epsilon, steps, C) / _std(256, epsilon, steps, C)
    if math.isclose(advantage, 1 / want_ratio, rel_tol=0.01):
        raise ExerciseFailed(
            "that is std(256) / std(64), the other way round: divide the B = 64 noise by the B = 256 one"
        )
    at_epochs = (_sigma(64, epsilon, epochs=8) / 64) / (_sigma(256, epsilon, epochs=8) / 256)
    if math.isclose(advantage, at_epochs, rel_tol=0.01):
        raise ExerciseFailed("that is the ratio at 8 EPOCHS (fewer steps for B = 256); here both runs take 180 steps")
    require(
        math.isclose(advantage, want_ratio, rel_tol=0.01),
        f"advantage = {advantage:.4g}: divide noise_std_at_fixed_steps(64, ...) by noise_std_at_fixed_steps(256, ...) "
        f"at epsilon = {epsilon:g}, {steps} steps, C = {C:g}",
    )
    return f"sigma*C/B at a fixed number of steps matches the accountant, and so does your ratio ({advantage:.2f})"
