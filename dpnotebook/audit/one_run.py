"""Empirical epsilon from one training run (Steinke, Nasr & Jagielski 2023).

Put ``m`` *canaries* in the training set, each with probability 1/2 independently (a fair
coin ``S_i`` per canary). After training, an attacker scores every canary and makes ``r``
guesses: "in" for the ``k+`` highest scores, "out" for the ``k-`` lowest, and abstains on the
rest. If training is ``(epsilon, delta)``-DP, each guess is right with probability at most
``p = e^epsilon / (1 + e^epsilon)`` however the others went, so the number right ``v`` is
dominated by ``Binomial(r, p)`` (plus a ``delta`` term). Seeing many more right than that
*refutes* epsilon: the largest epsilon refuted at significance ``alpha`` is a lower bound on
the true epsilon that holds with probability at least ``1 - alpha``.

The bound with ``delta`` (Steinke et al., Theorem 5.2) is
``P[v or more right] <= beta + 2 m delta * max over 1 <= i <= v of (P[Bin(r, p) >= v - i] - beta) / i``
with ``beta = P[Bin(r, p) >= v]`` (:func:`one_run_p_value`). Trying several ``(k+, k-)`` and
keeping the best is paid for with a Bonferroni correction (``alpha`` divided by the number
tried) in :func:`audit_one_run`. jax_privacy's ``auditing`` module computes the same bound.

>>> one_run_p_value(canaries=100, guesses=10, correct=10, epsilon=0.0)   # ten coins all right: 2^-10
0.0009765625
>>> eps = one_run_epsilon(canaries=100, guesses=10, correct=10, significance=0.05)
>>> p = 0.05 ** (1 / 10)                     # closed form: p^10 = 0.05, epsilon = log(p / (1 - p))
>>> round(eps, 4), round(math.log(p / (1 - p)), 4)
(1.0519, 1.0519)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binom

__all__ = [
    "one_run_p_value",
    "one_run_epsilon",
    "OneRunAudit",
    "audit_one_run",
    "default_guesses",
    "worst_case_correct",
]


def _count(name: str, value: int, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < low
        or (high is not None and value > high)
    ):
        limit = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name}={value!r} is invalid: it must be an int {limit}.")
    return int(value)


def _check_delta(delta: float) -> float:
    if not 0 <= delta < 1 or math.isnan(delta):
        raise ValueError(f"delta={delta!r} is invalid: it must be in [0, 1). Fix: pass the accountant's delta.")
    return float(delta)


def _check_significance(significance: float) -> float:
    if not 0 < significance < 1:
        raise ValueError(
            f"significance={significance!r} is invalid: it must be in (0, 1), e.g. 0.05 "
            "(the bound then holds with probability 95%)."
        )
    return float(significance)


def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0) -> float:
    """How likely ``correct`` or more right guesses out of ``guesses`` are under ``(epsilon, delta)``-DP.

    Args:
        canaries: m, the number of canaries (each included with probability 1/2).
        guesses: r, the guesses made (abstentions not counted).
        correct: v, the right ones.
        epsilon, delta: the privacy claim tested.

    >>> one_run_p_value(canaries=10, guesses=4, correct=0, epsilon=1.0)
    1.0
    """
    m = _count("canaries", canaries, 1)
    r = _count("guesses", guesses, 0, m)
    v = _count("correct", correct, 0, r)
    delta = _check_delta(delta)
    if v == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(binom.sf(v - 1, r, p))
    if delta == 0:
        return beta
    i = np.arange(1, v + 1)
    alpha = float(np.max((binom.sf(v - i - 1, r, p) - beta) / i))
    return min(1.0, beta + 2 * m * delta * alpha)


def one_run_epsilon(
    *, canaries: int, guesses: int, correct: int, delta: float = 0.0, significance: float = 0.05
) -> float:
    """The largest epsilon that ``correct`` right out of ``guesses`` refutes at ``significance`` (0 if none).

    >>> one_run_epsilon(canaries=100, guesses=10, correct=5)      # half right: a coin
    0.0
    """
    significance = _check_significance(significance)

    def excess(eps: float) -> float:
        return significance - one_run_p_value(
            canaries=canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta
        )

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        if high > 1e3:  # all right with a negligible delta term: refuted at any epsilon
            return math.inf
        high *= 2
    return float(brentq(excess, high / 2 if high > 1 else 0.0, high, xtol=1e-6))


def worst_case_correct(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int) -> int:
    """Right guesses of "in" for the ``k_in`` highest scores and "out" for the ``k_out`` lowest, ties broken worst.

    The bound assumes each guess is a function of the training run's output, and exactly
    ``k_in + k_out`` guesses (Steinke et al. need ``||T'||_1 <= r`` almost surely). Where a group of
    equal scores straddles a cut, *which* of its canaries are guessed is not a function of the
    output: breaking the tie by position would let the order in which the canaries are listed
    decide (issue #28: 1,000 equal scores listed members first gave epsilon >= 4.57). So the
    count is conservative: inside a straddling group, the guesses are taken to land on the wrong
    canaries first (non-members for "in", members for "out"). Every tie-breaking, by position or
    by independent coins, is right at least this often, so the bound computed from this count
    holds for any order of the canaries and any ties; without ties it is the plain count.

    >>> worst_case_correct(np.array([3.0, 2.0, 2.0, 1.0, 0.0]), np.array([True, True, False, False, False]), 2, 1)
    2
    >>> worst_case_correct(np.zeros(1000), np.arange(1000) < 500, 300, 300)   # all tied: nothing is known
    0
    """
    s = np.asarray(scores, dtype=float)
    inc = np.asarray(included, dtype=bool)
    m = s.size
    order = np.argsort(-s, kind="stable")
    ranked, members = s[order], inc[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    ends = np.r_[starts[1:], m]
    correct = 0
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        a = int(members[lo:hi].sum())  # members in this tie group
        b = (hi - lo) - a  # non-members
        j_in = max(0, min(hi, k_in) - lo)  # slots of the "in" cut inside the group
        j_out = max(0, hi - max(lo, m - k_out))  # slots of the "out" cut inside the group
        right_in = max(0, j_in - b)  # "in" guesses land on non-members first
        correct += right_in + max(0, j_out - (a - right_in))  # "out" guesses on the members left
    return correct


def default_guesses(canaries: int) -> list[tuple[int, int]]:
    """The ``(k+, k-)`` tried when none are given: ``k+`` = 1%, 2%, 5%, 10%, 20%, 30% of the canaries,
    with ``k- = 0`` and ``k- = k+`` (at most 12 pairs).

    >>> default_guesses(1000)[:3]
    [(10, 0), (10, 10), (20, 0)]
    """
    m = _count("canaries", canaries, 1)
    ks = sorted({max(1, round(m * f)) for f in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)})
    return [(k, k_minus) for k in ks for k_minus in (0, k) if k + k_minus <= m]


@dataclass
class OneRunAudit:
    """The best bound :func:`audit_one_run` found.

    Attributes:
        epsilon: the empirical lower bound on epsilon (holds with probability ``1 - significance``).
        canaries: m.
        guesses_in, guesses_out: the "in" and "out" guesses of the bound reported: ``k+`` and ``k-``, or
            always (a tie that straddles the cut is counted at its worst, see :func:`worst_case_correct`).
        correct: right guesses among them.
        delta, significance: as given.
        tried: how many ``(k+, k-)`` pairs were tried (the Bonferroni factor).
    """

    epsilon: float
    canaries: int
    guesses_in: int
    guesses_out: int
    correct: int
    delta: float
    significance: float
    tried: int

    @property
    def guesses(self) -> int:
        """``k+ + k-``."""
        return self.guesses_in + self.guesses_out

    def __str__(self) -> str:
        return (
            f"empirical epsilon >= {self.epsilon:.3g} with probability {1 - self.significance:.0%} "
            f"({self.correct}/{self.guesses} right: {self.guesses_in} 'in', {self.guesses_out} 'out', "
            f"of {self.canaries} canaries; delta = {self.delta:g}; best of {self.tried})"
        )


def audit_one_run(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    *,
    delta: float = 0.0,
    significance: float = 0.05,
    guesses: Sequence[int | tuple[int, int]] | None = None,
) -> OneRunAudit:
    """Turn canary scores into a high-confidence lower bound on epsilon.

    Args:
        scores: one score per canary, higher when it looks trained on (e.g. ``-loss``).
        included: the coin of each canary: ``True`` if it was in the training set. It must be
            drawn independently with probability 1/2 (:func:`~dpnotebook.audit.canaries.draw_inclusion`).
        delta: the delta of the claim tested (the accountant's delta).
        significance: the chance that the bound is wrong, shared out over the pairs tried.
        guesses: ``k+`` or ``(k+, k-)`` pairs to try (default :func:`default_guesses`). Ties are never
            broken by position: a tie that straddles a cut is counted at its worst
            (:func:`worst_case_correct`), so the bound holds for any order of the canaries and any ties.

    >>> rng = np.random.default_rng(0)
    >>> included = rng.random(1000) < 0.5
    >>> audit_one_run(rng.standard_normal(1000), included).epsilon          # scores that say nothing
    0.0
    >>> audit_one_run(np.where(included, 1.0, 0.0) + rng.random(1000), included).epsilon > 3
    True
    >>> audit_one_run(np.zeros(1000), np.arange(1000) < 500).epsilon         # all tied, members listed first
    0.0
    """
    s = np.asarray(scores, dtype=float).reshape(-1)
    inc = np.asarray(included).reshape(-1)
    if s.shape != inc.shape or s.size == 0 or np.isnan(s).any():
        raise ValueError(
            f"scores has shape {s.shape} and included {inc.shape}: give one finite score and one "
            "inclusion flag per canary."
        )
    if inc.dtype != bool:
        raise ValueError(f"included has dtype {inc.dtype}: pass the coins as booleans (True = in training).")
    m = s.size
    pairs = [(g, 0) if isinstance(g, (int, np.integer)) else tuple(g) for g in (guesses or default_guesses(m))]
    for k_in, k_out in pairs:
        if k_in < 0 or k_out < 0 or k_in + k_out > m or k_in + k_out == 0:
            raise ValueError(
                f"guesses (k+={k_in}, k-={k_out}) is invalid for {m} canaries: need k+, k- >= 0 and "
                f"1 <= k+ + k- <= {m}."
            )
    alpha = _check_significance(significance) / len(pairs)
    best = None
    for k_in, k_out in pairs:
        right = worst_case_correct(s, inc, k_in, k_out)
        eps = one_run_epsilon(canaries=m, guesses=k_in + k_out, correct=right, delta=delta, significance=alpha)
        if best is None or eps > best.epsilon:
            best = OneRunAudit(eps, m, k_in, k_out, right, _check_delta(delta), significance, len(pairs))
    assert best is not None
    return best
