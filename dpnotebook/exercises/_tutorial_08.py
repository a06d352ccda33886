"""Checks of tutorial 08 (what epsilon means): the best threshold, the ε for a margin, the ε an attack proves.

The last is computed here from ``scipy.stats.beta`` (95% Clopper–Pearson ends on both rates, both inequalities
of (ε, δ)-DP); no library function returns it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.stats import beta, norm

from dpnotebook.audit import advantage_bound, attack_roc, gaussian_epsilon
from dpnotebook.exercises._core import ExerciseFailed, number, register_check, spot_slip


def _score_sets() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(8)
    return [
        (np.array([3.0, 2.0, 1.5]), np.array([1.0, 0.0, 1.6])),  # the docstring's example
        (rng.standard_normal(200) + 1.0, rng.standard_normal(300)),  # Gaussian, mu = 1
        (rng.exponential(1.0, 150), rng.exponential(2.0, 150)),  # members score LOWER here
        (np.round(rng.standard_normal(100) + 0.5, 1), np.round(rng.standard_normal(100), 1)),  # ties
    ]


def _advantage_at(threshold: float, members: np.ndarray, others: np.ndarray) -> float:
    return float(np.mean(members >= threshold) - np.mean(others >= threshold))


@register_check(
    "08.best_threshold",
    todo="write best_threshold(member_scores, nonmember_scores): the t that maximises "
    "TPR(t) - FPR(t), where the attacker says 'member' when score >= t",
)
def check_best_threshold(best_threshold: Callable[[np.ndarray, np.ndarray], float]) -> str:
    for members, others in _score_sets():
        t = best_threshold(members.copy(), others.copy())
        t = number(t, f"return one number, the threshold (got {type(t).__name__})")
        best = attack_roc(members, others).advantage
        got = _advantage_at(t, members, others)
        if math.isclose(got, best, abs_tol=1e-12):
            continue
        if math.isclose(_advantage_at(t + 1e-9, members, others), best, abs_tol=1e-12):
            raise ExerciseFailed(
                "your threshold is one of the scores but counts it on the wrong side: the attacker "
                "says 'member' when score >= t, so a score equal to t counts as 'member'"
            )
        if math.isclose(-got, best, abs_tol=1e-12) or got < 0:
            raise ExerciseFailed(
                "your threshold maximises FPR - TPR: higher scores mean 'member', so count the "
                "members at or above t (TPR) minus the non-members at or above t (FPR)"
            )
        raise ExerciseFailed(
            f"on one score set your threshold {t:.4g} reaches TPR - FPR = {got:.3f}, but "
            f"{best:.3f} is possible: try every score as a threshold (and +inf), keep the best"
        )
    return "reaches the best advantage on every score set"


@register_check(
    "08.epsilon_for_margin",
    todo="write epsilon_for_margin(margin, delta): the largest epsilon at which any "
    "(epsilon, delta)-DP training keeps every attacker's TPR - FPR <= margin",
)
def check_epsilon_for_margin(epsilon_for_margin: Callable[[float, float], float]) -> str:
    for margin in (0.05, 0.1, 0.3, 0.6):
        for delta in (0.0, 1e-5, 1e-3):
            answer = epsilon_for_margin(margin, delta)
            eps = number(answer, f"return one finite number, epsilon (got {answer!r})", finite=True)
            got = advantage_bound(max(eps, 0.0), delta)
            if math.isclose(got, margin, rel_tol=1e-4, abs_tol=1e-9):
                continue
            if delta > 0 and math.isclose(advantage_bound(max(eps, 0.0), 0.0), margin, rel_tol=1e-4):
                raise ExerciseFailed(
                    "right without delta, but delta adds to what an attacker can gain: the bound is "
                    "(e^eps - 1 + 2 delta) / (e^eps + 1); solve it with delta"
                )
            if delta > 0 and math.isclose(eps, gaussian_epsilon(2 * norm.ppf((1 + margin) / 2), delta), rel_tol=1e-3):
                raise ExerciseFailed(
                    "that is the epsilon of the Gaussian mechanism with this best advantage; the "
                    "question is about every (epsilon, delta)-DP training: use the bound "
                    "(e^eps - 1 + 2 delta) / (e^eps + 1), which holds for all of them"
                )
            side = (
                "too large: some (eps, delta)-DP training lets an attacker gain more"
                if got > margin
                else "too small: a larger epsilon still keeps the advantage within the margin"
            )
            raise ExerciseFailed(
                f"at margin={margin}, delta={delta} your epsilon {eps:.4g} is {side} "
                f"(its bound is {got:.4f}, not {margin})"
            )
    return "advantage_bound(epsilon_for_margin(m, d), d) == m for every margin and delta tried"


# (true positives, members, false positives, non-members, delta): a strong attack at a low FPR, one the second
# inequality refutes far beyond the first (eps up to 3.88 against 0.43), one at chance, one with no false
# positive, a weak one.
_ATTACKS = [
    (300, 500, 5, 500, 1e-5),
    (500, 500, 300, 500, 1e-5),
    (60, 500, 55, 500, 1e-5),
    (40, 500, 0, 500, 1e-5),
    (150, 500, 100, 500, 0.0),
    (120, 400, 20, 400, 0.05),
]


def _refuted(
    tp: int, members: int, fp: int, nonmembers: int, delta: float, *, level: float = 0.975, corners: str = "safe"
) -> float:
    """The epsilon an attack's counts refute (the oracle), or a common mistake's version of it."""
    tail = 1 - level

    def low(k: int, n: int) -> float:
        return 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))

    def high(k: int, n: int) -> float:
        return 1.0 if k == n else float(beta.ppf(1 - tail, k + 1, n - k))

    if corners == "point":
        tpr, fpr = tp / members, fp / nonmembers
    elif corners == "optimistic":
        tpr, fpr = high(tp, members), low(fp, nonmembers)
    else:
        tpr, fpr = low(tp, members), high(fp, nonmembers)
    first = math.log((tpr - delta) / fpr) if tpr > delta and fpr > 0 else (math.inf if tpr > delta else -math.inf)
    both = corners != "first"  # "first": the safe corners, the first inequality only
    second = math.log((1 - fpr - delta) / (1 - tpr)) if both and 1 - fpr - delta > 0 and tpr < 1 else -math.inf
    return max(0.0, first, second)


@register_check(
    "08.epsilon_from_attack",
    todo="write epsilon_from_attack(tp, members, fp, nonmembers, delta): the largest epsilon the attack's "
    "counts refute at 95% confidence (0 if none)",
)
def check_epsilon_from_attack(epsilon_from_attack: Callable[[int, int, int, int, float], float]) -> str:
    for tp, n, fp, nn, delta in _ATTACKS:
        answer = epsilon_from_attack(tp, n, fp, nn, delta)
        got = number(answer, f"return one number, epsilon (got {answer!r})")
        want = _refuted(tp, n, fp, nn, delta)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        where = f"for {tp}/{n} members and {fp}/{nn} non-members called 'member' (delta={delta})"
        if got < 0:
            raise ExerciseFailed(
                f"{where} you return {got:.4g}: an attack that violates neither inequality refutes nothing, "
                "and the answer is 0, not a negative epsilon"
            )
        slips = [
            (
                _refuted(tp, n, fp, nn, delta, corners="point"),
                "you used the measured rates tp/members and fp/nonmembers as if they were exact; they are "
                "estimates: a lucky sample would refute too much. Use the Clopper-Pearson interval of each",
            ),
            (
                _refuted(tp, n, fp, nn, delta, corners="optimistic"),
                "you took the ends of the intervals that help the attack (TPR high, FPR low); the proof "
                "needs the ends that help the claim: the LOWER end of TPR and the UPPER end of FPR",
            ),
            (
                _refuted(tp, n, fp, nn, delta, level=0.95),
                "you took each bound at 95% on its own (the ends of a 90% interval), but both must hold "
                "together: 2.5% each, so that the two fail at most 2.5% + 2.5% = 5% of the time; use the "
                "ends of each rate's 95% two-sided interval (97.5% each)",
            ),
            (
                _refuted(tp, n, fp, nn, 0.0),
                "you left out delta: the inequalities are TPR <= e^eps FPR + delta and 1 - TPR >= "
                "e^-eps (1 - FPR - delta); subtract delta before taking the logarithm",
            ),
            (
                _refuted(tp, n, fp, nn, delta, corners="first"),
                "you used only TPR <= e^eps FPR + delta; an attack with a high TPR at a high FPR violates "
                "the second inequality, 1 - TPR >= e^-eps (1 - FPR - delta): take the larger of the two",
            ),
        ]
        spot_slip(got, slips, want, prefix=f"{where}: ")
        raise ExerciseFailed(f"{where} your epsilon {got:.4g} is not the one the counts refute ({want:.4g})")
    return "the epsilon each attack proves, with intervals on both rates and both inequalities"
