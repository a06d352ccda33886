"""Tutorial 03b's checkers: each common mistake gets its hint, a stub is "not yet solved", the right answer
passes, and the library's neighbouring quantities (exact σ, dp_accounting's ε, integer orders) do not."""

import math

import pytest

from dpnotebook.exercises import Status, judge
from dpnotebook.privacy import classic_rdp_epsilon, compute_epsilon


def _stub(*args):
    raise NotImplementedError("your code here")


def _rr(p):
    return math.inf if p == 1 else math.log((1 + p) / (1 - p))


def _verdict_is(verdict, hint):
    return verdict.solved if hint is None else (verdict.status is Status.WRONG and hint in verdict.hint)


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_rr, None),
        (lambda p: math.log(p / (1 - p)), "always the lie"),
        (lambda p: (1 + p) / (1 - p), "natural logarithm"),
        (lambda p: math.log((1 - p) / (1 + p)), "negative"),
        (lambda p: math.log10((1 + p) / (1 - p)), "base 10 or 2"),
        (lambda p: math.log((1 + p) / 2), "write both probabilities"),
        (lambda p: math.log((1 + p) / (1 - p)), "return math.inf"),  # ZeroDivisionError at p = 1
        (lambda p: 1e300 if p == 1 else _rr(p), "return math.inf"),
        (lambda p: "ln 3", "return one number"),
    ],
)
def test_rr_epsilon(answer, hint) -> None:
    assert _verdict_is(judge("03b.rr_epsilon", answer), hint), judge("03b.rr_epsilon", answer)


def _classic(epsilon, delta, sensitivity):
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon={epsilon}: Theorem A.1 needs 0 < epsilon < 1")
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def _guarded(formula):
    def answer(epsilon, delta, sensitivity):
        if not 0 < epsilon < 1:
            raise ValueError("outside (0, 1)")
        return formula(epsilon, delta, sensitivity)

    return answer


def _exact(epsilon, delta, sensitivity):
    from dpnotebook.privacy import get_noise_multiplier

    return sensitivity * get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=1.0, steps=1)


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_classic, None),
        (_guarded(lambda e, d, s: s * math.sqrt(2 * math.log(1 / d)) / e), "ln(1/δ)"),
        (_guarded(lambda e, d, s: s * 2 * math.log(1.25 / d) / e), "square root is missing"),
        (_guarded(lambda e, d, s: s * math.sqrt(math.log(1.25 / d)) / e), "factor 2"),
        (_guarded(lambda e, d, s: s * math.sqrt(2 * math.log(1.25 / d)) * e), "divide by ε"),
        (_guarded(lambda e, d, s: math.sqrt(2 * math.log(1.25 / d)) / e), "multiply by it"),
        (_guarded(lambda e, d, s: s**2 * math.sqrt(2 * math.log(1.25 / d)) / e), "not Δ²"),
        (_guarded(_exact), "exact analysis allows"),  # the accountant's σ: a library call is not the answer
        (_guarded(lambda e, d, s: 3.0), "not the smallest σ Theorem A.1 allows"),
        (lambda e, d, s: s * math.sqrt(2 * math.log(1.25 / d)) / e, "proved only for 0 < ε < 1"),
        (lambda e, d, s: _classic(e, d, s) if e < 1 else 0.1 * s, "proved only for 0 < ε < 1"),
        (lambda e, d, s: _classic(e, d, s) if e != 10.0 else math.sqrt(2 * math.log(1.25 / d)) / e, "really fails"),
        (lambda e, d, s: _classic(e, d, s) if 0 < e < 1 else 1 / 0, "raised ZeroDivisionError; raise ValueError"),
    ],
)
def test_classic_sigma(answer, hint) -> None:
    assert _verdict_is(judge("03b.classic_sigma", answer), hint), judge("03b.classic_sigma", answer)


def test_classic_sigma_really_fails_at_epsilon_ten() -> None:
    """The hint's claim: Theorem A.1's σ at ε = 10, δ = 1e-5 gives an exact ε above 10."""
    from dpnotebook.audit import gaussian_epsilon

    sigma = math.sqrt(2 * math.log(1.25 / 1e-5)) / 10
    assert gaussian_epsilon(1 / sigma, 1e-5) > 10.3


def _rdp(k, sigma, delta):
    return k / (2 * sigma**2) + math.sqrt(2 * k * math.log(1 / delta)) / sigma


def _by_search(k, sigma, delta):
    from scipy.optimize import minimize_scalar

    f = lambda a: k * a / (2 * sigma**2) + math.log(1 / delta) / (a - 1)  # noqa: E731
    return minimize_scalar(f, bounds=(1 + 1e-9, 1e6), method="bounded", options={"xatol": 1e-10}).fun


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_rdp, None),
        (_by_search, None),  # a numerical minimisation over real orders is right too
        (lambda k, s, d: _rdp(1, s, d), "one mechanism's epsilon"),
        (lambda k, s, d: k * _rdp(1, s, d), "basic composition"),
        (lambda k, s, d: classic_rdp_epsilon(noise_multiplier=s, sample_rate=1.0, steps=k, delta=d), "integer orders"),
        (
            lambda k, s, d: compute_epsilon(noise_multiplier=s, sample_rate=1.0, steps=k, delta=d, accountant="rdp"),
            "tighter method",
        ),
        (lambda k, s, d: _rdp(k, s, d) * 1.01, "above the minimum"),
        (lambda k, s, d: k / (2 * s) + math.sqrt(2 * k * math.log(1 / d)) / s, "RDP k α / (2σ²)"),
    ],
)
def test_rdp_epsilon(answer, hint) -> None:
    assert _verdict_is(judge("03b.rdp_epsilon", answer), hint), judge("03b.rdp_epsilon", answer)


@pytest.mark.parametrize("exercise_id", ["03b.rr_epsilon", "03b.classic_sigma", "03b.rdp_epsilon"])
def test_stubs_are_not_yet_solved(exercise_id: str) -> None:
    assert judge(exercise_id, _stub).status is Status.NOT_YET
    assert judge(exercise_id, ...).status is Status.NOT_YET
