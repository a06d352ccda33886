"""Tutorial 08's checkers: each common mistake gets its own hint, a stub is "not yet solved", the answer passes."""

from __future__ import annotations

import math

import pytest
from scipy.stats import beta

from dpnotebook.exercises import Status, judge


def _stub(*args, **kwargs):
    raise NotImplementedError("your code here")


def _epsilon_from_attack(level=0.975, corners="safe", use_delta=True, second=True, floor=True):
    def answer(tp, members, fp, nonmembers, delta):
        d = delta if use_delta else 0.0
        lo = lambda k, n: float(beta.ppf(1 - level, k, n - k + 1)) if k else 0.0  # noqa: E731
        hi = lambda k, n: float(beta.ppf(level, k + 1, n - k)) if k < n else 1.0  # noqa: E731
        if corners == "point":
            tpr, fpr = tp / members, fp / nonmembers
        elif corners == "optimistic":
            tpr, fpr = hi(tp, members), lo(fp, nonmembers)
        else:
            tpr, fpr = lo(tp, members), hi(fp, nonmembers)
        candidates = [0.0] if floor else []
        if tpr > d:
            candidates.append(math.log((tpr - d) / fpr) if fpr > 0 else math.inf)
        if second and tpr < 1 and 1 - fpr - d > 0:
            candidates.append(math.log((1 - fpr - d) / (1 - tpr)))
        return max(candidates) if candidates else -1.0

    return answer


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_epsilon_from_attack(), None),
        (_epsilon_from_attack(corners="point"), "as if they were exact"),
        (_epsilon_from_attack(corners="optimistic"), "LOWER end of TPR"),
        (_epsilon_from_attack(level=0.95), "97.5%"),
        (_epsilon_from_attack(use_delta=False), "left out delta"),
        (_epsilon_from_attack(second=False), "second inequality"),
        (_epsilon_from_attack(floor=False), "not a negative epsilon"),
        (lambda *a: "3.2", "return one number"),
    ],
)
def test_epsilon_from_attack_hints(answer, hint) -> None:
    verdict = judge("08.epsilon_from_attack", answer)
    if hint is None:
        assert verdict.solved, verdict.hint
    else:
        assert verdict.status is Status.WRONG and hint in verdict.hint, verdict.hint


def test_epsilon_from_attack_stub_is_not_yet_solved() -> None:
    assert judge("08.epsilon_from_attack", _stub).status is Status.NOT_YET


def test_epsilon_for_margin_hints() -> None:
    def right(margin, delta):
        return math.log((1 + margin - 2 * delta) / (1 - margin))

    assert judge("08.epsilon_for_margin", right).solved
    no_delta = judge("08.epsilon_for_margin", lambda m, d: math.log((1 + m) / (1 - m)))
    assert "delta adds" in no_delta.hint
