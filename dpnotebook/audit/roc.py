"""How well an attack's scores separate members from non-members: ROC, AUC, TPR at low FPR, advantage.

Convention: a *higher* score means "more likely a member"; the attacker says "member" when
the score is at least a threshold ``t``. Each threshold gives a point ``(FPR, TPR)``: the
fraction of non-members and of members at or above it. The *advantage* ``max(TPR - FPR)``
(Yeom et al. 2018) is how much better than a coin the best threshold does; it is bounded by
``(e^epsilon - 1 + 2 delta) / (e^epsilon + 1)`` under ``(epsilon, delta)``-DP (Humphries et al.
2020), see :func:`advantage_bound`. Security-minded papers read TPR at a low FPR (Carlini et al.
2022): an attack that is sure about a few records matters even when its AUC is near 1/2.

Measured rates are estimates from finite samples. :func:`clopper_pearson` gives an exact interval
for one rate; :func:`held_out_point` chooses a threshold on one half of the scores and measures it
on the other, with intervals on both rates (a threshold chosen on the very scores it is measured on
flatters it); :func:`advantage_noise_floor` says how large an advantage scores *without* any signal
reach by chance, by permuting the member/non-member labels.

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
from scipy.stats import beta

__all__ = [
    "AttackROC",
    "attack_roc",
    "advantage_bound",
    "clopper_pearson",
    "advantage_noise_floor",
    "OperatingPoint",
    "held_out_point",
]


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


def _check_confidence(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: it must be in (0, 1), e.g. 0.95.")
    return float(confidence)


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval for a rate measured as ``successes / trials``.

    It covers the true rate with probability at least ``confidence`` whatever the rate is (it errs
    wide, never narrow); each end alone fails with probability at most ``(1 - confidence) / 2``.

    >>> [round(v, 4) for v in clopper_pearson(5, 500)]          # FPR 1% measured on 500 non-members
    [0.0033, 0.0232]
    >>> clopper_pearson(0, 10)[0], clopper_pearson(10, 10)[1]
    (0.0, 1.0)
    """
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"trials={trials!r} is invalid: it must be an int >= 1.")
    if isinstance(successes, bool) or not isinstance(successes, (int, np.integer)) or not 0 <= successes <= trials:
        raise ValueError(f"successes={successes!r} is invalid: it must be an int in [0, trials={trials}].")
    tail = (1 - _check_confidence(confidence)) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def advantage_noise_floor(
    member_scores: object, nonmember_scores: object, *, quantile: float = 0.95, permutations: int = 1000, seed: int = 0
) -> float:
    """The advantage that these scores reach by chance alone: its ``quantile`` over random relabellings.

    The member/non-member labels are shuffled among the pooled scores (keeping both group sizes),
    which leaves no signal, and the best threshold's ``TPR - FPR`` is measured each time. An attack
    whose advantage is below this floor has shown nothing; even the best threshold on pure noise gets
    there because it is chosen on the same scores it is measured on.

    For continuous scores it is the quantile of the one-sided two-sample Kolmogorov–Smirnov statistic:
    about ``sqrt(-ln(1 - quantile) (1/n_members + 1/n_nonmembers) / 2)``, 0.077 for 500 a side.

    >>> rng = np.random.default_rng(0)
    >>> floor = advantage_noise_floor(rng.standard_normal(500), rng.standard_normal(500))    # no signal
    >>> 0.07 < floor < 0.085
    True
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    if not 0 < quantile < 1:
        raise ValueError(f"quantile={quantile!r} is invalid: it must be in (0, 1), e.g. 0.95.")
    if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations={permutations!r} is invalid: it must be an int >= 1, e.g. 1000.")
    pooled = np.concatenate([members, others])
    rng = np.random.default_rng(seed)
    found = np.empty(permutations)
    for i in range(permutations):
        shuffled = rng.permutation(pooled)
        found[i] = attack_roc(shuffled[: members.size], shuffled[members.size :]).advantage
    return float(np.quantile(found, quantile))


@dataclass
class OperatingPoint:
    """One threshold, chosen on held-out scores and measured on the others, with exact intervals.

    Attributes:
        threshold: "member" when the score is at least this.
        true_positives, members: members at or above it, and members measured.
        false_positives, nonmembers: the same for non-members.
        tpr_interval, fpr_interval: Clopper–Pearson intervals; together they hold with probability
            at least ``confidence`` (each is taken at ``1 - (1 - confidence) / 2``).
        confidence: as given.
    """

    threshold: float
    true_positives: int
    members: int
    false_positives: int
    nonmembers: int
    tpr_interval: tuple[float, float]
    fpr_interval: tuple[float, float]
    confidence: float

    @property
    def tpr(self) -> float:
        """The measured TPR."""
        return self.true_positives / self.members

    @property
    def fpr(self) -> float:
        """The measured FPR."""
        return self.false_positives / self.nonmembers

    def __str__(self) -> str:
        (tl, th), (fl, fh) = self.tpr_interval, self.fpr_interval
        return (
            f"TPR {self.tpr:.3f} [{tl:.3f}, {th:.3f}] ({self.true_positives}/{self.members}), "
            f"FPR {self.fpr:.3f} [{fl:.3f}, {fh:.3f}] ({self.false_positives}/{self.nonmembers}), "
            f"{self.confidence:.0%} jointly"
        )


def held_out_point(
    member_scores: object,
    nonmember_scores: object,
    *,
    target_fpr: float,
    confidence: float = 0.95,
    seed: int = 0,
) -> OperatingPoint:
    """Choose the threshold on a random half of each group, measure it on the other half.

    The threshold is the lowest one whose FPR on the choosing half is at most ``target_fpr``; the
    rates reported are those of the measuring half, which played no part in the choice, so their
    Clopper–Pearson intervals are honest.

    Args:
        member_scores, nonmember_scores: see :func:`attack_roc` (at least 2 of each).
        target_fpr: the false positive rate aimed at, e.g. 0.1 or 0.01.
        confidence: of the two intervals together.
        seed: seeds the split.

    >>> rng = np.random.default_rng(1)
    >>> point = held_out_point(rng.standard_normal(1000) + 2, rng.standard_normal(1000), target_fpr=0.1)
    >>> point.members, point.nonmembers, 0.02 < point.fpr < 0.2, point.tpr > 0.6
    (500, 500, True, True)
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    if members.size < 2 or others.size < 2:
        raise ValueError("held_out_point needs at least 2 members and 2 non-members: one half chooses, one measures.")
    if not 0 <= target_fpr <= 1:
        raise ValueError(f"target_fpr={target_fpr!r} is invalid: it must be in [0, 1], e.g. 0.1.")
    joint = _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    m, o = rng.permutation(members), rng.permutation(others)
    m_choose, m_measure = m[: m.size // 2], m[m.size // 2 :]
    o_choose, o_measure = o[: o.size // 2], o[o.size // 2 :]
    roc = attack_roc(m_choose, o_choose)
    threshold = float(roc.thresholds[roc.fpr <= target_fpr + 1e-12][-1])
    tp, fp = int((m_measure >= threshold).sum()), int((o_measure >= threshold).sum())
    each = 1 - (1 - joint) / 2
    return OperatingPoint(
        threshold,
        tp,
        m_measure.size,
        fp,
        o_measure.size,
        clopper_pearson(tp, m_measure.size, each),
        clopper_pearson(fp, o_measure.size, each),
        joint,
    )
