"""Checks of tutorial 03b (privacy by hand): randomized response's ε, Theorem A.1's σ, and the RDP ε of k Gaussians.

No library function returns these, so the checks compare with the formulas and recognise the library's
neighbouring quantities (the exact Gaussian σ, tighter conversions, integer orders) to say why they are not
the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpnotebook.exercises._core import ExerciseFailed, close, number, register_check, spot_slip

_RR_PS = (0.1, 0.25, 0.5, 0.8, 0.95, 0.0)  # p = 0 last: ln(p / (1 - p)) fails there


def _number(value: Any, what: str) -> float:
    return number(value, f"{what} returned {value!r}: return one number")


@register_check(
    "03b.rr_epsilon",
    todo="write rr_epsilon(p): the epsilon of randomized response that tells the truth with probability p, "
    "otherwise answers with a fair coin",
)
def check_rr_epsilon(rr_epsilon: Callable[[float], float]) -> str:
    """ε = ln(P(yes | yes) / P(yes | no)) = ln((1 + p) / (1 - p)) for p < 1; inf at p = 1."""
    for p in _RR_PS:
        got = _number(rr_epsilon(p), f"rr_epsilon({p})")
        right = math.log((1 + p) / (1 - p))
        if close(got, right):
            continue
        base = "that logarithm is in base 10 or 2; epsilon uses the natural logarithm (math.log)"
        slips = [
            (
                math.log(p / (1 - p)) if p > 0 else math.nan,
                "that is ln(p / (1 - p)), the epsilon when the answer that is not the truth is always the lie. Here "
                "it is a fair coin, which says the truth half the time: P(yes | yes) = p + (1 - p) / 2",
            ),
            (
                (1 + p) / (1 - p),
                "the likelihood ratio P(yes | yes) / P(yes | no) = e^epsilon; epsilon is its natural logarithm",
            ),
            (
                -right,
                "negative: you divided the smaller probability by the larger. epsilon bounds the largest "
                "ratio, P(yes | yes) / P(yes | no)",
            ),
            (right / math.log(10), base),
            (right / math.log(2), base),
        ]
        spot_slip(got, slips, right, prefix=f"rr_epsilon({p}) = {got:.3f}: ")
        raise ExerciseFailed(
            f"rr_epsilon({p}) = {got:.4g}, but P(yes | yes) = {(1 + p) / 2:g} and P(yes | no) = {(1 - p) / 2:g}: "
            "epsilon is the log of the larger of the two ratios between them (write both probabilities first)"
        )
    try:
        at_one = rr_epsilon(1.0)
    except ZeroDivisionError:
        at_one = None
    if at_one is None or not (isinstance(at_one, (int, float)) and math.isinf(at_one) and at_one > 0):
        raise ExerciseFailed(
            f"rr_epsilon(1.0) gave {'ZeroDivisionError' if at_one is None else repr(at_one)}: at p = 1 everyone "
            "tells the truth, P(yes | no) = 0 and no epsilon bounds the ratio: return math.inf there"
        )
    return "rr_epsilon(p) = ln((1 + p) / (1 - p)) for every p tried, ln 3 at p = 1/2, and inf at p = 1"


def _classic(epsilon: float, delta: float, sensitivity: float) -> float:
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def exact_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest noise std at which the Gaussian mechanism is (ε, δ)-DP (Balle & Wang 2018), for the hints."""
    from scipy.optimize import brentq

    from dpnotebook.audit import gaussian_delta

    mu = brentq(lambda m: gaussian_delta(epsilon, m) - delta, 1e-6, 100.0, xtol=1e-12)
    return sensitivity / mu


_SIGMA_CASES = ((0.5, 1e-5, 1.0), (0.1, 1e-6, 2.0), (0.9, 1e-3, 0.5))


@register_check(
    "03b.classic_sigma",
    todo="write classic_sigma(epsilon, delta, sensitivity): the noise std Theorem A.1 asks for, and a "
    "ValueError where the theorem does not apply",
)
def check_classic_sigma(classic_sigma: Callable[[float, float, float], float]) -> str:
    """σ = Δ sqrt(2 ln(1.25/δ)) / ε on (0, 1), a ValueError outside."""
    for epsilon, delta, sensitivity in _SIGMA_CASES:
        call = f"classic_sigma({epsilon}, {delta}, {sensitivity})"
        got = _number(classic_sigma(epsilon, delta, sensitivity), call)
        right = _classic(epsilon, delta, sensitivity)
        if close(got, right):
            continue
        log_term = math.log(1.25 / delta)
        mistakes = [
            (
                sensitivity * math.sqrt(2 * math.log(1 / delta)) / epsilon,
                "you used ln(1/δ); the theorem has ln(1.25/δ)",
            ),
            (sensitivity * 2 * log_term / epsilon, "the square root is missing: c is the square root of 2 ln(1.25/δ)"),
            (sensitivity * math.sqrt(log_term) / epsilon, "the factor 2 under the square root is missing"),
            (sensitivity * math.sqrt(2 * log_term) * epsilon, "σ grows as ε shrinks: divide by ε, do not multiply"),
            (math.sqrt(2 * log_term) / epsilon, "σ scales with the sensitivity Δ: multiply by it"),
            (sensitivity**2 * math.sqrt(2 * log_term) / epsilon, "σ scales with Δ, not Δ²"),
        ]
        spot_slip(got, mistakes, right, prefix=f"{call} = {got:.4g}: ")
        exact = exact_gaussian_sigma(epsilon, delta, sensitivity)
        if close(got, exact, rel=2e-2):
            raise ExerciseFailed(
                f"{call} = {got:.4g} is the smallest σ the exact analysis allows (Balle & Wang 2018, what the "
                f"accountants compute); the exercise asks for the classic bound of Theorem A.1, {right / exact:.2f}× "
                "larger: write its formula"
            )
        raise ExerciseFailed(
            f"{call} = {got:.4g}, not the smallest σ Theorem A.1 allows: σ = c Δ / ε, with c at its limit"
        )
    for epsilon in (1.0, 2.0, 10.0, 0.0, -0.5):
        try:
            got = classic_sigma(epsilon, 1e-5, 1.0)
        except ValueError:
            continue
        except Exception as err:  # noqa: BLE001 - any other error is the student's to rename
            raise ExerciseFailed(
                f"classic_sigma({epsilon}, 1e-05, 1.0) raised {type(err).__name__}; raise ValueError, with a "
                "message saying the theorem needs 0 < epsilon < 1"
            ) from None
        why = (
            f" (by the exact analysis that σ gives ε = {_exact_epsilon(float(got)):.2f} > {epsilon}: the bound "
            "really fails there)"
            if epsilon == 10.0
            else ""
        )
        raise ExerciseFailed(
            f"classic_sigma({epsilon}, 1e-05, 1.0) returned {got!r}, but Theorem A.1 is proved only for "
            f"0 < ε < 1{why}: raise ValueError outside it"
        )
    return (
        "σ = Δ sqrt(2 ln(1.25/δ)) / ε on 0 < ε < 1, a ValueError elsewhere; at ε = 0.5, δ = 1e-5 it is "
        f"{_classic(0.5, 1e-5, 1.0) / exact_gaussian_sigma(0.5, 1e-5, 1.0):.2f}× the exact σ"
    )


def _exact_epsilon(sigma: float) -> float:
    from dpnotebook.audit import gaussian_epsilon

    return gaussian_epsilon(1.0 / sigma, 1e-5) if sigma > 0 else math.inf


def _rdp_classic(k: int, sigma: float, delta: float, alpha: float) -> float:
    return k * alpha / (2 * sigma**2) + math.log(1 / delta) / (alpha - 1)


def _rdp_right(k: int, sigma: float, delta: float) -> float:
    return k / (2 * sigma**2) + math.sqrt(2 * k * math.log(1 / delta)) / sigma


_RDP_CASES = ((10, 1.0, 1e-5), (1, 2.0, 1e-5), (100, 5.0, 1e-6), (1000, 10.0, 1e-5), (3, 0.7, 1e-3))


@register_check(
    "03b.rdp_epsilon",
    todo="write rdp_epsilon(k, sigma, delta): compose k Gaussian RDP curves, convert with "
    "eps = RDP(alpha) + ln(1/delta)/(alpha - 1), and minimise over every real alpha > 1",
)
def check_rdp_epsilon(rdp_epsilon: Callable[[int, float, float], float]) -> str:
    """ε = min over real α > 1 of k α/(2σ²) + ln(1/δ)/(α − 1) = k/(2σ²) + sqrt(2k ln(1/δ))/σ."""
    for k, sigma, delta in _RDP_CASES:
        call = f"rdp_epsilon({k}, {sigma}, {delta})"
        got = _number(rdp_epsilon(k, sigma, delta), call)
        right = _rdp_right(k, sigma, delta)
        if close(got, right, rel=1e-4):
            continue
        if k > 1 and close(got, _rdp_right(1, sigma, delta), rel=1e-3):
            raise ExerciseFailed(
                f"{call} = {got:.4g} is one mechanism's epsilon: the RDP of k compositions is k times one's, "
                "k α / (2σ²), before you convert"
            )
        if k > 1 and close(got, k * _rdp_right(1, sigma, delta), rel=1e-3):
            raise ExerciseFailed(
                f"{call} = {got:.4g} = k × one mechanism's epsilon (basic composition, each step paying its own "
                "ln(1/δ) term): add the RDP curves first, then convert once"
            )
        integer = min(_rdp_classic(k, sigma, delta, a) for a in range(2, 257))
        if close(got, integer, rel=1e-4):
            raise ExerciseFailed(
                f"{call} = {got:.5g} is the minimum over integer orders; the best order here is "
                f"α = {1 + sigma * math.sqrt(2 * math.log(1 / delta) / k):.3f}, not an integer: minimise over every "
                "real α > 1 (set the derivative in α to zero)"
            )
        if _tighter_conversions(k, sigma, delta, got):
            raise ExerciseFailed(
                f"{call} = {got:.4g} comes from a tighter method (dp_accounting's conversion or the exact "
                "Gaussian composition); this exercise asks for the classic conversion by hand: "
                "ε = k α / (2σ²) + ln(1/δ) / (α − 1), minimised over α > 1"
            )
        side = "above the minimum: is your α the minimiser?" if got > right else "below what this conversion gives"
        raise ExerciseFailed(f"{call} = {got:.5g}, {side} (check the RDP k α / (2σ²) and the ln(1/δ) / (α − 1) term)")
    return "ε = k/(2σ²) + sqrt(2k ln(1/δ))/σ at the best order α = 1 + σ sqrt(2 ln(1/δ)/k), for every case tried"


def _tighter_conversions(k: int, sigma: float, delta: float, got: float) -> bool:
    """Whether ``got`` is dp_accounting's RDP epsilon, or the exact epsilon of k Gaussians (μ = √k / σ)."""
    from dpnotebook.audit import gaussian_epsilon
    from dpnotebook.privacy import compute_epsilon

    candidates = [
        compute_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=k, delta=delta, accountant="rdp"),
        compute_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=k, delta=delta, accountant="pld"),
        gaussian_epsilon(math.sqrt(k) / sigma, delta),
    ]
    return any(close(got, value, rel=1e-2) for value in candidates)
