"""Checkers for tutorial 08 (what epsilon means).

* ``08.best_threshold``: the student's ``best_threshold(member_scores, nonmember_scores)``
  must reach the largest advantage ``TPR - FPR`` that any threshold reaches on those scores,
  as :func:`~dpnotebook.audit.roc.attack_roc` computes it, on several score sets.
* ``08.epsilon_for_margin``: the student's ``epsilon_for_margin(margin, delta)`` must give
  the largest epsilon at which *every* ``(epsilon, delta)``-DP training keeps every attacker's
  advantage within ``margin``: :func:`~dpnotebook.audit.roc.advantage_bound` of the answer
  must equal ``margin``.

>>> import numpy as np
>>> from dpnotebook.audit.roc import attack_roc
>>> check_best_threshold(lambda m, n: attack_roc(m, n).best_threshold)
'reaches the best advantage on every score set'
>>> check_epsilon_for_margin(lambda margin, delta: float(np.log((1 + margin - 2 * delta) / (1 - margin))))
'advantage_bound(epsilon_for_margin(m, d), d) == m for every margin and delta tried'
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from dpnotebook.audit.roc import advantage_bound, attack_roc
from dpnotebook.audit.tradeoff import gaussian_epsilon
from dpnotebook.exercises.core import ExerciseFailed, register_check, require

__all__ = ["check_best_threshold", "check_epsilon_for_margin"]


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
        require(
            isinstance(t, (int, float, np.floating)) and not isinstance(t, bool),
            f"return one number, the threshold (got {type(t).__name__})",
        )
        best = attack_roc(members, others).advantage
        got = _advantage_at(float(t), members, others)
        if math.isclose(got, best, abs_tol=1e-12):
            continue
        if math.isclose(_advantage_at(float(t) + 1e-9, members, others), best, abs_tol=1e-12):
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
            f"on one score set your threshold {float(t):.4g} reaches TPR - FPR = {got:.3f}, but "
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
            eps = epsilon_for_margin(margin, delta)
            require(
                isinstance(eps, (int, float, np.floating)) and not isinstance(eps, bool) and math.isfinite(eps),
                f"return one finite number, epsilon (got {eps!r})",
            )
            got = advantage_bound(max(float(eps), 0.0), delta)
            if math.isclose(got, margin, rel_tol=1e-4, abs_tol=1e-9):
                continue
            if delta > 0 and math.isclose(advantage_bound(max(float(eps), 0.0), 0.0), margin, rel_tol=1e-4):
                raise ExerciseFailed(
                    "right without delta, but delta adds to what an attacker can gain: the bound is "
                    "(e^eps - 1 + 2 delta) / (e^eps + 1); solve it with delta"
                )
            if delta > 0 and math.isclose(float(eps), gaussian_epsilon(2 * _gauss_mu(margin), delta), rel_tol=1e-3):
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
                f"at margin={margin}, delta={delta} your epsilon {float(eps):.4g} is {side} "
                f"(its bound is {got:.4f}, not {margin})"
            )
    return "advantage_bound(epsilon_for_margin(m, d), d) == m for every margin and delta tried"


def _gauss_mu(margin: float) -> float:
    """Half the mu whose Gaussian best advantage ``2 Phi(mu / 2) - 1`` is ``margin``."""
    from scipy.stats import norm

    return float(norm.ppf((1 + margin) / 2))
