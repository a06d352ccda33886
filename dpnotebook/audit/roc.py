"""How well an attack's scores separate members from non-members: ROC, AUC, TPR at low FPR, advantage.

Convention: a *higher* score means "more likely a member"; the attacker says "member" when
the score is at least a threshold ``t``. Each threshold gives a point ``(FPR, TPR)``: the
fraction of non-members and of members at or above it. The *advantage* ``max(TPR - FPR)``
(Yeom et al. 2018) is how much better than a coin the best threshold does; it is bounded by
``(e^epsilon - 1 + 2 delta) / (e^epsilon + 1)`` under ``(epsilon, delta)``-DP (Humphries et al.
2020), see :func:`advantage_bound`. Security-minded papers read TPR at a low FPR (Carlini et al.
2022): an attack that is sure about a few records matters even when its AUC is near 1/2.

Why not scikit-learn's ``roc_curve`` / ``roc_auc_score``: scikit-learn is a dependency of the
``lab`` extra only, while :mod:`dpnotebook.audit` needs the core dependencies alone (torch, numpy,
scipy, dp-accounting), and these 20 lines of numpy keep every threshold (``drop_intermediate=False``
in scikit-learn's terms) with the member/non-member vocabulary the attack tutorials use.
``tests/audit/test_membership.py`` checks that the curve and the AUC equal scikit-learn's, ties included.

>>> roc = attack_roc([3.0, 2.0, 1.5], [1.0, 0.0, 1.6])
>>> roc.fpr.tolist(), roc.tpr.tolist()
([0.0, 0.0, 0.0, 0.3333333333333333, 0.3333333333333333, 0.6666666666666666, 1.0], [0.0, 0.3333333333333333, 0.6666666666666666, 0.6666666666666666, 1.0, 1.0, 1.0])
>>> round(roc.auc, 4), round(roc.advantage, 4), roc.tpr_at(0.0)
(0.8889, 0.6667, 0.6666666666666666)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["AttackROC", "attack_roc", "advantage_bound"]


def _scores(name: str, values: object) -> np.ndarray:
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.size == 0 or np.isnan(a).any():
        raise ValueError(
            f"{name} has {a.size} scores{' with NaN' if a.size else ''}: an attack needs at least one "
            "score per group and no NaN. Fix: score every member and non-member."
        )
    return a


@dataclass
class AttackROC:
    """The ROC curve of a score-threshold attack.

    Attributes:
        member_scores: the scores of the records that were in the training set.
        nonmember_scores: the scores of the records that were not.
        thresholds: decreasing; ``+inf`` first (nobody called a member).
        fpr: fraction of non-members with score ``>= threshold``, increasing from 0 to 1.
        tpr: fraction of members with score ``>= threshold``, increasing from 0 to 1.
    """

    member_scores: np.ndarray
    nonmember_scores: np.ndarray
    thresholds: np.ndarray
    fpr: np.ndarray
    tpr: np.ndarray

    @property
    def auc(self) -> float:
        """Area under the ROC curve (ties count one half): 0.5 is a coin, 1 separates perfectly."""
        return float(np.sum(np.diff(self.fpr) * (self.tpr[1:] + self.tpr[:-1]) / 2))

    @property
    def advantage(self) -> float:
        """``max over thresholds of TPR - FPR``: 0 for a coin, 1 for a perfect attack."""
        return float(np.max(self.tpr - self.fpr))

    @property
    def best_threshold(self) -> float:
        """The threshold that reaches :attr:`advantage`."""
        return float(self.thresholds[int(np.argmax(self.tpr - self.fpr))])

    def tpr_at(self, fpr: float) -> float:
        """The highest TPR of a threshold whose FPR is at most ``fpr`` (no interpolation)."""
        if not 0 <= fpr <= 1:
            raise ValueError(f"fpr={fpr!r} is invalid: it must be in [0, 1], e.g. fpr=0.01.")
        return float(self.tpr[self.fpr <= fpr + 1e-12].max())


def attack_roc(member_scores: object, nonmember_scores: object) -> AttackROC:
    """The ROC curve of "member if score >= t" over every threshold ``t`` the scores define.

    Args:
        member_scores: one score per training record (higher: more likely a member).
        nonmember_scores: one score per record not trained on.

    >>> attack_roc([1.0], [1.0]).advantage                     # same scores: no better than a coin
    0.0
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([members, others]))[::-1]])
    m_sorted, o_sorted = np.sort(members), np.sort(others)
    tpr = (members.size - np.searchsorted(m_sorted, thresholds, side="left")) / members.size
    fpr = (others.size - np.searchsorted(o_sorted, thresholds, side="left")) / others.size
    return AttackROC(members, others, thresholds, fpr, tpr)


def advantage_bound(epsilon: float, delta: float = 0.0) -> float:
    """The largest membership advantage ``TPR - FPR`` an ``(epsilon, delta)``-DP training allows:
    ``(e^epsilon - 1 + 2 delta) / (e^epsilon + 1)``.

    >>> round(advantage_bound(1.0), 4), round(advantage_bound(8.0, 1e-5), 4)
    (0.4621, 0.9993)
    """
    if not (epsilon >= 0) or math.isnan(epsilon) or not 0 <= delta <= 1:
        raise ValueError(f"epsilon={epsilon!r}, delta={delta!r} are invalid: need epsilon >= 0 and delta in [0, 1].")
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))
