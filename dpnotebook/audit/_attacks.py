"""What an attacker can tell: DP as a hypothesis test, membership attacks, canaries and epsilon from one run.

(epsilon, delta)-DP bounds every attacker's TPR at each FPR (:func:`dp_tpr_bound`, :func:`gaussian_tpr`,
:func:`pld_tpr`); membership attacks on a trained model (:func:`loss_threshold_attack`,
:func:`calibrated_attack`) are measured by their ROC (:func:`attack_roc`) with error bars; and
:func:`audit_one_run` turns the scores of canaries, records each put in the training set on a fair
coin (:func:`draw_inclusion`), into a lower bound on epsilon (Steinke, Nasr & Jagielski 2023). Canaries
are input records (:func:`random_image_canaries`, :func:`mislabeled_canaries`) or, white-box, crafted
per-sample gradients (:class:`GradientCanaries`); :func:`audited_digits_run` trains a small MLP on
scikit-learn's digits with both, then attacks and audits it. docs/concepts/accounting.md ("What
epsilon means to an attacker") gives the formulas.

>>> mu = gaussian_mu(sensitivity=1.0, noise_std=1.0)
>>> eps = gaussian_epsilon(mu, delta=1e-5)
>>> round(float(gaussian_tpr(0.05, mu)), 4), round(eps, 3)          # Phi(-1.645 + 1)
(0.2595, 4.377)
>>> bool(gaussian_tpr(0.05, mu) <= dp_tpr_bound(0.05, eps, 1e-5))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from scipy.optimize import brentq
from scipy.stats import beta, binom, norm
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.device import check_device
from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts
from dpnotebook.privacy._arguments import (
    check_noise_multiplier,
    check_positive_int,
    check_positive_number,
    check_sample_rate,
)

Array = npt.NDArray[Any]
Records = tuple[Tensor, Tensor]


def _rates(name: str, values: float | Array) -> Array:
    a = np.asarray(values, dtype=float)
    if a.size and (np.isnan(a).any() or a.min() < 0 or a.max() > 1):
        raise ValueError(f"{name}={values!r} is invalid: rates must lie in [0, 1]. Fix: pass values in [0, 1].")
    return a


def _in_open_unit(name: str, value: float, example: str) -> float:
    if not 0 < value < 1:
        raise ValueError(f"{name}={value!r} is invalid: it must be in (0, 1), e.g. {name}={example}.")
    return float(value)


def _count(name: str, value: int, low: int, high: int | None = None) -> int:
    value = check_positive_int(name, value, minimum=low)
    if high is not None and value > high:
        raise ValueError(f"{name}={value!r} is invalid: it must be an int between {low} and {high}.")
    return value


def _scores(name: str, values: object) -> Array:
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.size == 0 or np.isnan(a).any():
        raise ValueError(f"{name} has {a.size} scores{' with NaN' if a.size else ''}: score every record, without NaN.")
    return a


def _check_delta(delta: float) -> float:
    if not 0 <= delta < 1:
        raise ValueError(f"delta={delta!r} is invalid: it must be in [0, 1). Fix: pass the accountant's delta.")
    return float(delta)


def gaussian_mu(*, sensitivity: float, noise_std: float) -> float:
    """``mu = sensitivity / noise_std``: how many noise standard deviations one record moves the output.

    >>> gaussian_mu(sensitivity=1.0, noise_std=0.5)
    2.0
    """
    return check_positive_number("sensitivity", sensitivity) / check_positive_number("noise_std", noise_std)


def gaussian_tpr(fpr: float | Array, mu: float) -> Array:
    """The best TPR at each FPR against the Gaussian mechanism: ``Phi(Phi^-1(FPR) + mu)`` (``mu = 0``: a coin).

    >>> gaussian_tpr(np.array([0.0, 0.5, 1.0]), 0.0).tolist(), round(float(gaussian_tpr(0.5, 1.0)), 4)
    ([0.0, 0.5, 1.0], 0.8413)
    """
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"mu={mu!r} is invalid: it must be a finite number >= 0. Fix: mu = sensitivity / sigma.")
    return np.asarray(norm.cdf(norm.ppf(_rates("fpr", fpr)) + mu))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """The exact delta of the Gaussian mechanism at ``epsilon`` (Balle & Wang 2018).

    >>> round(gaussian_delta(0.0, 1.0), 4)               # Phi(1/2) - Phi(-1/2)
    0.3829
    """
    mu = check_positive_number("mu", mu)
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon + norm.logcdf(-mu / 2 - epsilon / mu)))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which the Gaussian mechanism with this ``mu`` is ``(epsilon, delta)``-DP.

    >>> gaussian_epsilon(0.01, 0.5)                      # delta above delta(0): no epsilon needed
    0.0
    """
    mu = check_positive_number("mu", mu)
    if gaussian_delta(0.0, mu) <= _in_open_unit("delta", delta, "1e-5"):
        return 0.0
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2
    return float(brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, high, xtol=1e-10))


def dp_tpr_bound(fpr: float | Array, epsilon: float, delta: float) -> Array:
    """The most TPR any attacker has at each FPR against an ``(epsilon, delta)``-DP mechanism.

    >>> dp_tpr_bound(np.array([0.0, 0.1, 0.5]), np.log(2), 0.0).tolist()
    [0.0, 0.2, 0.75]
    """
    a = _rates("fpr", fpr)
    if not (epsilon >= 0 and math.isfinite(epsilon)) or not 0 <= delta <= 1:
        raise ValueError(
            f"epsilon={epsilon!r}, delta={delta!r} are invalid: need a finite epsilon >= 0, delta in [0, 1]."
        )
    with np.errstate(over="ignore", invalid="ignore"):  # epsilon > 709: e^epsilon is inf, and 0 * inf is nan
        grow = np.where(a > 0, np.exp(np.float64(epsilon)) * a, 0.0)
    bound = np.minimum(grow + delta, 1 - math.exp(-epsilon) * (1 - a - delta))
    return np.clip(bound, 0.0, 1.0)


def pld_tpr(
    fpr: float | Array,
    *,
    noise_multiplier: float,
    sample_rate: float = 1.0,
    steps: int = 1,
    value_discretization_interval: float = 1e-3,
    epsilons: Array | None = None,
) -> Array:
    """The most TPR at each FPR against ``steps`` Poisson-subsampled Gaussian steps (a DP-SGD run).

    The lower envelope of :func:`dp_tpr_bound`'s lines over ``epsilons`` (default 400 from 0 to 30), with
    ``delta(epsilon)`` from ``dp_accounting``'s privacy loss distribution (pessimistic: it errs upwards).

    >>> a = np.array([0.01, 0.1, 0.5])
    >>> bool(np.abs(pld_tpr(a, noise_multiplier=1.0) - gaussian_tpr(a, 1.0)).max() < 2e-3)
    True
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    a = _rates("fpr", fpr)
    sigma = check_positive_number("noise_multiplier", noise_multiplier)
    dist = pld.from_gaussian_mechanism(
        sigma,
        sensitivity=1.0,
        sampling_prob=check_sample_rate(sample_rate),
        value_discretization_interval=value_discretization_interval,
    )
    if check_positive_int("steps", steps) > 1:
        dist = dist.self_compose(steps)
    eps = np.linspace(0.0, 30.0, 400) if epsilons is None else np.asarray(epsilons, dtype=float)
    deltas = np.asarray(dist.get_delta_for_epsilon(eps), dtype=float)
    return np.min([dp_tpr_bound(a, e, min(d, 1.0)) for e, d in zip(eps, deltas, strict=True)], axis=0)


@dataclass
class AttackROC:
    """The ROC curve of "member if score >= t" (a higher score: more likely a member).

    Attributes:
        member_scores, nonmember_scores: the scores of the records trained on, and of the others.
        thresholds: decreasing; ``+inf`` first (nobody called a member).
        fpr, tpr: the fractions of non-members and of members with score ``>= threshold``, from 0 to 1.
    """

    member_scores: Array
    nonmember_scores: Array
    thresholds: Array
    fpr: Array
    tpr: Array

    @property
    def auc(self) -> float:
        """Area under the ROC curve (ties count one half): 0.5 is a coin, 1 separates perfectly."""
        return float(np.sum(np.diff(self.fpr) * (self.tpr[1:] + self.tpr[:-1]) / 2))

    @property
    def advantage(self) -> float:
        """``max over thresholds of TPR - FPR`` (Yeom et al. 2018): 0 for a coin, 1 for a perfect attack."""
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

    >>> attack_roc([1.0], [1.0]).advantage                     # same scores: no better than a coin
    0.0
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([members, others]))[::-1]])
    tpr = (members.size - np.searchsorted(np.sort(members), thresholds, side="left")) / members.size
    fpr = (others.size - np.searchsorted(np.sort(others), thresholds, side="left")) / others.size
    return AttackROC(members, others, thresholds, fpr, tpr)


def advantage_bound(epsilon: float, delta: float = 0.0) -> float:
    """The largest membership advantage ``TPR - FPR`` an ``(epsilon, delta)``-DP training allows (Humphries et al.).

    >>> round(advantage_bound(1.0), 4), round(advantage_bound(8.0, 1e-5), 4)
    (0.4621, 0.9993)
    """
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"epsilon={epsilon!r}, delta={delta!r} are invalid: need epsilon >= 0 and delta in [0, 1].")
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval for a rate measured as ``successes / trials``.

    It covers the true rate with probability at least ``confidence`` whatever the rate (it errs wide).

    >>> [round(v, 4) for v in clopper_pearson(5, 500)]          # FPR 1% measured on 500 non-members
    [0.0033, 0.0232]
    >>> clopper_pearson(0, 10)[0], clopper_pearson(10, 10)[1]
    (0.0, 1.0)
    """
    trials = _count("trials", trials, 1)
    successes = _count("successes", successes, 0, trials)
    tail = (1 - _in_open_unit("confidence", confidence, "0.95")) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def advantage_noise_floor(
    member_scores: object, nonmember_scores: object, *, quantile: float = 0.95, permutations: int = 1000, seed: int = 0
) -> float:
    """The advantage these scores reach by chance alone: its ``quantile`` over random relabellings.

    Shuffling the member/non-member labels (both group sizes kept) leaves no signal: an attack below
    this floor has shown nothing.

    >>> rng = np.random.default_rng(0)
    >>> 0.07 < advantage_noise_floor(rng.standard_normal(500), rng.standard_normal(500)) < 0.085
    True
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    _in_open_unit("quantile", quantile, "0.95")
    pooled, rng = np.concatenate([members, others]), np.random.default_rng(seed)
    found = []
    for _ in range(check_positive_int("permutations", permutations)):
        shuffled = rng.permutation(pooled)
        found.append(attack_roc(shuffled[: members.size], shuffled[members.size :]).advantage)
    return float(np.quantile(found, quantile))


@dataclass
class OperatingPoint:
    """One threshold, chosen on held-out scores and measured on the others, with exact intervals.

    Attributes:
        threshold: "member" when the score is at least this.
        true_positives, members: members at or above it, and members measured.
        false_positives, nonmembers: the same for non-members.
        tpr_interval, fpr_interval: Clopper–Pearson intervals that hold together with probability
            at least ``confidence``.
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
    member_scores: object, nonmember_scores: object, *, target_fpr: float, confidence: float = 0.95, seed: int = 0
) -> OperatingPoint:
    """Choose the threshold on a random half of each group (``seed``), measure it on the other half.

    The threshold is the lowest whose FPR on the choosing half is at most ``target_fpr``; the rates
    reported, and their intervals, are the measuring half's. Needs at least 2 scores a group.

    >>> rng = np.random.default_rng(1)
    >>> point = held_out_point(rng.standard_normal(1000) + 2, rng.standard_normal(1000), target_fpr=0.1)
    >>> point.members, point.nonmembers, 0.02 < point.fpr < 0.2, point.tpr > 0.6
    (500, 500, True, True)
    """
    members = _scores("member_scores", member_scores)
    others = _scores("nonmember_scores", nonmember_scores)
    if members.size < 2 or others.size < 2:
        raise ValueError("held_out_point needs at least 2 members and 2 non-members: one half chooses, one measures.")
    _rates("target_fpr", target_fpr)
    joint = _in_open_unit("confidence", confidence, "0.95")
    rng = np.random.default_rng(seed)
    m, o = rng.permutation(members), rng.permutation(others)
    m_measure, o_measure = m[m.size // 2 :], o[o.size // 2 :]
    roc = attack_roc(m[: m.size // 2], o[: o.size // 2])
    threshold = float(roc.thresholds[roc.fpr <= target_fpr + 1e-12][-1])
    tp, fp = int((m_measure >= threshold).sum()), int((o_measure >= threshold).sum())
    each = 1 - (1 - joint) / 2  # the two intervals hold together with probability joint
    tpr, fpr = clopper_pearson(tp, m_measure.size, each), clopper_pearson(fp, o_measure.size, each)
    return OperatingPoint(threshold, tp, m_measure.size, fp, o_measure.size, tpr, fpr, joint)


def _cross_entropy(output: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(output, target, reduction="none")


LossFn = Callable[[Tensor, Tensor], Tensor]


def example_losses(
    model: nn.Module, inputs: Tensor, targets: Tensor, *, loss_fn: LossFn = _cross_entropy, batch_size: int = 1024
) -> Tensor:
    """One loss per record (first dimension), in eval mode, without gradients, float64 on the CPU.

    ``loss_fn(output, targets)`` must give one value per record (default: cross-entropy, ``reduction="none"``).

    >>> torch.manual_seed(0) and None
    >>> example_losses(nn.Linear(4, 2), torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])).shape
    torch.Size([6])
    """
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs has {inputs.shape[0]} records but targets has {targets.shape[0]}: pass one per input."
        )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = [
                loss_fn(model(inputs[i : i + batch_size]), targets[i : i + batch_size])
                for i in range(0, inputs.shape[0], batch_size)
            ]
    finally:
        model.train(was_training)
    losses = torch.cat([o.reshape(-1) for o in out]).detach().double().cpu() if out else torch.zeros(0)
    if losses.shape != (inputs.shape[0],):
        raise ValueError(
            f"loss_fn gave shape {tuple(losses.shape)} for {len(inputs)} records: give one loss per record."
        )
    return losses


def loss_threshold_attack(
    model: nn.Module, members: Records, nonmembers: Records, *, loss_fn: LossFn = _cross_entropy
) -> AttackROC:
    """Score each ``(inputs, targets)`` record by ``-loss`` under ``model`` (``loss_fn`` as :func:`example_losses`)."""
    return attack_roc(
        -example_losses(model, *members, loss_fn=loss_fn).numpy(),
        -example_losses(model, *nonmembers, loss_fn=loss_fn).numpy(),
    )


def calibrated_attack(
    model: nn.Module,
    reference_models: Sequence[nn.Module],
    members: Records,
    nonmembers: Records,
    *,
    loss_fn: LossFn = _cross_entropy,
) -> AttackROC:
    """Score each record by its mean loss under ``reference_models`` (trained without it) minus the target's.

    >>> m = nn.Linear(2, 2)
    >>> r = calibrated_attack(m, [m], (torch.ones(2, 2), torch.zeros(2, dtype=torch.long)),
    ...                       (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)))
    >>> r.member_scores.tolist()                          # the target is its own reference: nothing left
    [0.0, 0.0]
    """
    if len(reference_models) == 0:
        raise ValueError("reference_models is empty: pass at least one model trained without the scored records.")

    def scores(records: Records) -> Tensor:
        target = example_losses(model, *records, loss_fn=loss_fn)
        reference = torch.stack([example_losses(r, *records, loss_fn=loss_fn) for r in reference_models]).mean(0)
        return reference - target

    return attack_roc(scores(members).numpy(), scores(nonmembers).numpy())


def sliced_attack(roc: AttackROC, member_groups: object, nonmember_groups: object) -> dict[int, AttackROC]:
    """The same attack's scores, one ROC per group (one integer per scored record, e.g. its class).

    A group's advantage is noisier than the whole's: compare it with that group's :func:`advantage_noise_floor`.

    >>> roc = attack_roc([3.0, 2.0, 1.0, 0.5], [1.0, 0.0, 2.5, 0.2])
    >>> {g: r.advantage for g, r in sliced_attack(roc, [0, 0, 1, 1], [0, 0, 1, 1]).items()}
    {0: 1.0, 1: 0.5}
    """
    mg, ng = np.asarray(member_groups).reshape(-1), np.asarray(nonmember_groups).reshape(-1)
    if mg.shape != roc.member_scores.shape or ng.shape != roc.nonmember_scores.shape:
        sizes = f"{mg.size} and {ng.size} groups for {roc.member_scores.size} and {roc.nonmember_scores.size} records"
        raise ValueError(f"{sizes}: pass one group per scored record, in order.")
    groups = sorted(set(mg.tolist()) & set(ng.tolist()))
    if not groups:
        raise ValueError("no group has both members and non-members: nothing to compare within a group.")
    return {int(g): attack_roc(roc.member_scores[mg == g], roc.nonmember_scores[ng == g]) for g in groups}


def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0) -> float:
    """How likely ``correct`` or more right of ``guesses`` are, ``canaries`` each in on a coin, under (ε, δ)-DP.

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
    beta_ = float(binom.sf(v - 1, r, p))
    if delta == 0:
        return beta_
    i = np.arange(1, v + 1)  # Theorem 5.2 of Steinke, Nasr & Jagielski (2023)
    alpha = float(np.max((binom.sf(v - i - 1, r, p) - beta_) / i))
    return min(1.0, beta_ + 2 * m * delta * alpha)


def one_run_epsilon(
    *, canaries: int, guesses: int, correct: int, delta: float = 0.0, significance: float = 0.05
) -> float:
    """The largest epsilon that ``correct`` right out of ``guesses`` refutes at ``significance`` (0 if none).

    >>> one_run_epsilon(canaries=100, guesses=10, correct=5)      # half right: a coin
    0.0
    """
    significance = _in_open_unit("significance", significance, "0.05")

    def excess(eps: float) -> float:
        return significance - one_run_p_value(
            canaries=canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta
        )

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:  # ends by epsilon = 64 at the latest: there p == 1.0 in float64, so P[Bin >= v] = 1
        high *= 2
    low = high / 2 if high > 1 else 0.0
    while high - low > 1e-7:  # bisection that keeps the refuted end: the bound's own p-value <= significance
        low, high = (mid, high) if excess(mid := (low + high) / 2) > 0 else (low, mid)
    return low


def worst_case_correct(scores: Array, included: Array, k_in: int, k_out: int) -> int:
    """Right guesses of "in" for the ``k_in`` highest scores and "out" for the ``k_out`` lowest, ties broken worst.

    In a tie group that straddles a cut the guesses land on the wrong canaries first, so the bound holds
    for any order and any ties (docs/guarantees.md, "Empirical bounds are sound for any input").

    >>> worst_case_correct(np.array([3.0, 2.0, 2.0, 1.0, 0.0]), np.array([True, True, False, False, False]), 2, 1)
    2
    >>> worst_case_correct(np.zeros(1000), np.arange(1000) < 500, 300, 300)   # all tied: nothing is known
    0
    """
    s = np.asarray(scores, dtype=float)
    order, m = np.argsort(-s, kind="stable"), s.size
    ranked, members = s[order], np.asarray(included, dtype=bool)[order]
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
    """The ``(k+, k-)`` tried by default: ``k+`` = 1, 2, 5, 10, 20, 30% of the canaries, ``k-`` = 0 or ``k+``.

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
        canaries, guesses_in, guesses_out, correct: m, ``k+`` and ``k-`` of the bound, right guesses among them.
        delta, significance: as given; tried: how many ``(k+, k-)`` pairs were tried (the Bonferroni factor).
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
    scores: Sequence[float] | Array,
    included: Sequence[bool] | Array,
    *,
    delta: float = 0.0,
    significance: float = 0.05,
    guesses: Sequence[int | tuple[int, int]] | None = None,
) -> OneRunAudit:
    """Turn canary scores into a high-confidence lower bound on epsilon.

    Args:
        scores: one score per canary, higher when it looks trained on (e.g. ``-loss``).
        included: each canary's fair coin (``True``: in the training set; :func:`~dpnotebook.audit.draw_inclusion`).
        delta: the delta of the claim tested (the accountant's delta).
        significance: the chance that the bound is wrong, shared out over the pairs tried.
        guesses: ``k+`` or ``(k+, k-)`` pairs to try (default :func:`default_guesses`).

    >>> rng = np.random.default_rng(0)
    >>> included = rng.random(1000) < 0.5
    >>> audit_one_run(rng.standard_normal(1000), included).epsilon, audit_one_run(np.zeros(1000), included).epsilon
    (0.0, 0.0)
    >>> audit_one_run(np.where(included, 1.0, 0.0) + rng.random(1000), included).epsilon > 3
    True
    """
    s, inc = np.asarray(scores, dtype=float).reshape(-1), _coins(np.asarray(included).reshape(-1))
    if s.shape != inc.shape or s.size == 0 or np.isnan(s).any():
        raise ValueError(
            f"scores {s.shape}, included {inc.shape}: give one finite score and one inclusion flag per canary."
        )
    m = s.size
    pairs = [(g, 0) if isinstance(g, (int, np.integer)) else tuple(g) for g in (guesses or default_guesses(m))]
    alpha = _in_open_unit("significance", significance, "0.05") / len(pairs)  # Bonferroni
    audits = []
    for k_in, k_out in pairs:
        if not (k_in >= 0 and k_out >= 0 and 1 <= k_in + k_out <= m):
            raise ValueError(f"guesses (k+={k_in}, k-={k_out}) is invalid for {m} canaries: need 1 <= k+ + k- <= {m}.")
        right = worst_case_correct(s, inc, k_in, k_out)
        eps = one_run_epsilon(canaries=m, guesses=k_in + k_out, correct=right, delta=delta, significance=alpha)
        audits.append(OneRunAudit(eps, m, k_in, k_out, right, _check_delta(delta), significance, len(pairs)))
    return max(audits, key=lambda a: a.epsilon)  # the first of the best


def draw_inclusion(canaries: int, *, seed: int) -> Array:
    """``canaries`` independent fair coins (``True``: put the canary in the training set), seeded.

    >>> bool((draw_inclusion(10, seed=1) == draw_inclusion(10, seed=1)).all())
    True
    """
    return np.random.default_rng(seed).random(check_positive_int("canaries", canaries)) < 0.5


def _coins(included: Array) -> Array:
    inc = np.asarray(included)
    if inc.dtype != bool or inc.ndim != 1:
        raise ValueError(
            f"included has dtype {inc.dtype}, shape {inc.shape}: pass the coins as booleans, one a canary."
        )
    return inc


def random_image_canaries(
    canaries: int,
    *,
    shape: tuple[int, ...] = (1, 8, 8),
    num_classes: int = 10,
    seed: int = 0,
    blank: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``canaries`` images of ``shape`` whose pixels are 0 or 1 on a fair coin, each with a uniform label.

    A model gets one right only by memorising it. ``blank`` is a boolean mask of pixels kept at 0.

    >>> x, y = random_image_canaries(3)
    >>> x.shape, y.shape
    (torch.Size([3, 1, 8, 8]), torch.Size([3]))
    """
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(canaries, *shape, generator=g) < 0.5).float()
    if blank is not None:
        x[:, blank] = 0.0
    return x, torch.randint(0, num_classes, (canaries,), generator=g)


def mislabeled_canaries(inputs: Tensor, targets: Tensor, *, num_classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """The same inputs, each with a label drawn uniformly among the *other* classes.

    >>> x, y = mislabeled_canaries(torch.zeros(5, 2), torch.tensor([0, 1, 2, 0, 1]), num_classes=3, seed=0)
    >>> bool((y != torch.tensor([0, 1, 2, 0, 1])).all())
    True
    """
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is invalid: a wrong label needs at least 2 classes.")
    if (
        targets.dtype not in (torch.int64, torch.int32)
        or targets.numel()
        and not 0 <= targets.min() <= targets.max() < num_classes
    ):
        raise ValueError(f"targets must be integer labels in [0, {num_classes}); got dtype {targets.dtype}.")
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(1, num_classes, targets.shape, generator=g)
    return inputs.clone(), (targets.long() + shift) % num_classes


def gaussian_mechanism_scores(
    included: Array, *, noise_multiplier: float, sensitivity: float = 1.0, seed: int = 0
) -> Array:
    """One run of the Gaussian mechanism on the canaries: ``sensitivity * (included + N(0, noise_multiplier^2))``."""
    inc, sigma = _coins(included), check_noise_multiplier(noise_multiplier)
    return (
        sensitivity * inc.astype(float) + np.random.default_rng(seed).standard_normal(inc.shape) * sigma * sensitivity
    )


def dp_sgd_canary_scores(
    included: Array, *, noise_multiplier: float, sample_rate: float, steps: int, seed: int = 0
) -> Array:
    """The canaries' coordinates after ``steps`` DP-SGD steps with C = 1 and gradient canaries.

    Canary ``i``'s clipped gradient is the unit vector of coordinate ``i``, sampled at ``sample_rate``
    in each step if it is in the data: a binomial count of the steps plus ``N(0, steps * sigma^2)``.

    >>> included = draw_inclusion(4, seed=0)
    >>> bool((dp_sgd_canary_scores(included, noise_multiplier=0.0, sample_rate=1.0, steps=3) == 3 * included).all())
    True
    """
    inc, steps = _coins(included), check_positive_int("steps", steps)
    sigma, q = check_noise_multiplier(noise_multiplier), check_sample_rate(sample_rate)
    rng = np.random.default_rng(seed)
    return rng.binomial(steps, q, inc.shape) * inc + rng.standard_normal(inc.shape) * sigma * math.sqrt(steps)


def unreached_coordinates(weight: Tensor, inputs: Tensor) -> Tensor:
    """The flat indices of a first ``nn.Linear`` layer's ``weight`` (``[out, in]``) that no input record reaches.

    ``inputs``: every training input, ``[records, in]`` or any shape that flattens to it. A record's
    gradient of ``weight[j, i]`` is ``backprop_j * input_i``: a Dirac canary there shares it with no record.

    >>> unreached_coordinates(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.0, 0.0]])).tolist()
    [1, 4]
    """
    if weight.dim() != 2:
        raise ValueError(f"weight has shape {tuple(weight.shape)}: pass a Linear layer's [out, in] weight.")
    flat = inputs.reshape(inputs.shape[0], -1)
    if flat.shape[1] != weight.shape[1]:
        raise ValueError(
            f"inputs have {flat.shape[1]} values per record, weight takes {weight.shape[1]}: pass its inputs."
        )
    return (flat == 0).all(0).expand(weight.shape[0], -1).reshape(-1).nonzero().reshape(-1)


class GradientCanaries:
    """``m`` canaries whose per-sample gradients the auditor writes into one parameter.

    Build them with :meth:`dirac` or :meth:`random`; put one row per *included* canary in the
    training data, with an id column (``-1`` for ordinary rows, ``i`` for canary ``i``); call
    :meth:`attach` once, and :meth:`inject` after each ``backward()``. ``projections`` holds, for
    each step, the released gradient's projection on each canary in units of C.

    >>> import dpnotebook
    >>> from dpnotebook.privacy import DPOptimizer
    >>> model = dpnotebook.wrap_model(nn.Linear(4, 1), "hooks")
    >>> canaries = GradientCanaries.dirac(model._module.weight, [0, 1, 2], np.array([True, False, True]))
    >>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
    ...                   max_grad_norm=1.0, expected_batch_size=3)
    >>> canaries.attach(opt)
    >>> model(torch.zeros(3, 4)).sum().backward()  # one ordinary row, the two canaries in the data (ids 0 and 2)
    >>> canaries.inject(torch.tensor([-1, 0, 2]))
    >>> opt.step()
    >>> canaries.scores("sum").round(4).tolist()   # clipped to C = 1, no noise: 1 for each canary sampled
    [1.0, 0.0, 1.0]
    """

    def __init__(
        self,
        parameter: Tensor,
        directions: Tensor | None,
        coordinates: Tensor | None,
        included: Array,
        gradient_norm: float,
    ) -> None:
        inc = _coins(included)
        count = directions.shape[0] if directions is not None else int(coordinates.numel())  # type: ignore[union-attr]
        if count != inc.size:
            raise ValueError(f"{count} canary directions but {inc.size} coins: pass one coin per canary.")
        self.parameter, self.directions, self.coordinates = parameter, directions, coordinates
        self.included, self.gradient_norm = inc, check_positive_number("gradient_norm", gradient_norm)
        self.projections: list[Array] = []
        self.sample_rate = self.noise_multiplier = math.nan
        self._others: list[Tensor] = []

    @classmethod
    def dirac(
        cls,
        parameter: Tensor,
        coordinates: Sequence[int] | Tensor,
        included: Array,
        *,
        gradient_norm: float = 10.0,
    ) -> GradientCanaries:
        """Canary ``i``'s gradient is ``gradient_norm`` at flat index ``coordinates[i]`` of ``parameter``, 0 elsewhere.

        >>> GradientCanaries.dirac(torch.zeros(2, 2), [0, 0], np.array([True, False]))
        Traceback (most recent call last):
        ...
        ValueError: coordinates repeat an index: two Dirac canaries there add up. Fix: pass distinct indices.
        """
        idx = torch.as_tensor(coordinates, dtype=torch.long).reshape(-1)
        if idx.numel() and (idx.min() < 0 or idx.max() >= parameter.numel()):
            raise ValueError(f"coordinates must be flat indices in [0, {parameter.numel()}), not {idx.tolist()}.")
        if idx.unique().numel() != idx.numel():
            raise ValueError(
                "coordinates repeat an index: two Dirac canaries there add up. Fix: pass distinct indices."
            )
        return cls(parameter, None, idx, included, gradient_norm)

    @classmethod
    def random(cls, parameter: Tensor, included: Array, *, seed: int, gradient_norm: float = 10.0) -> GradientCanaries:
        """Canary ``i``'s gradient is ``gradient_norm`` times a random unit direction in ``parameter``'s space.

        They overlap with every record's gradient: a weaker audit than Dirac canaries no record reaches.

        >>> c = GradientCanaries.random(torch.zeros(8, 8), np.ones(3, dtype=bool), seed=0)
        >>> torch.linalg.vector_norm(c.directions, dim=1).round(decimals=5).tolist()
        [1.0, 1.0, 1.0]
        """
        g = torch.Generator().manual_seed(seed)
        d = torch.randn(np.asarray(included).size, parameter.numel(), generator=g, dtype=torch.float64)
        d /= torch.linalg.vector_norm(d, dim=1, keepdim=True)
        return cls(parameter, d, None, included, gradient_norm)

    def attach(self, optimizer: object, *, sample_rate: float = math.nan) -> None:
        """Read each step's released gradient from this :class:`~dpnotebook.privacy.DPOptimizer` (a step hook).

        ``sample_rate``: q of the loader (needed for the ``"steps"`` score only).
        """
        from dpnotebook.privacy import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer is a {type(optimizer).__name__}: pass the DPOptimizer make_private returned.")
        if not any(p is self.parameter for p in optimizer.params):
            raise ValueError("the canaries' parameter is not one the optimizer updates: pass a parameter of its model.")
        self.sample_rate = float(sample_rate)
        self.noise_multiplier = float(optimizer.noise_multiplier)
        self._others = list(optimizer.params)
        optimizer.attach_step_hook(self._record)

    def _record(self, optimizer: Any) -> None:
        grad = self.parameter.grad
        if grad is None:
            raise RuntimeError("the DP step left no gradient on the canaries' parameter: was it in the optimizer?")
        scale = 1.0 / optimizer.max_grad_norm
        if optimizer.loss_reduction == "mean":  # the step divided by the expected batch
            scale *= optimizer.mean_divisor
        flat = grad.detach().reshape(-1).cpu().double()
        dirac = self.coordinates is not None
        projected = flat[self.coordinates] if dirac else self.directions @ flat  # type: ignore[operator]
        self.projections.append(projected.numpy() * scale)

    def inject(self, canary_ids: Tensor) -> None:
        """Write the crafted gradients into the rows of ``canary_ids`` (one id per row) that hold a canary.

        Call it after ``backward()`` and before ``optimizer.step()``. The canaries' rows of every other
        parameter the optimizer updates are zeroed, so a canary's whole gradient is the crafted one.
        """
        ids = canary_ids.reshape(-1).long().cpu()
        rows = (ids >= 0).nonzero().reshape(-1)
        parts = grad_sample_parts(self.parameter)  # one tensor per backward pass since zero_grad
        held = sum(g.shape[0] for g in parts)
        if not parts or held != ids.numel():
            raise RuntimeError(
                f"the canaries' parameter has grad_sample of {held if parts else None} rows for "
                f"{ids.numel()} rows: call inject after backward(), with a model wrapped in a mode that forms "
                "per-sample gradients (hooks, functorch or ew; ghost mode never forms them)."
            )
        if rows.numel() == 0:
            return
        which = ids[rows]
        if which.max() >= self.included.size:
            raise ValueError(f"canary id {int(which.max())} in the batch, but there are {self.included.size} canaries.")
        if not bool(torch.from_numpy(self.included)[which].all()):
            raise ValueError("a canary left out by its coin is in the batch: put only included canaries in the data.")
        for p in {self.parameter, *self._others}:
            for g, at, _ in _row_slices(grad_sample_parts(p), rows):
                g[at] = 0
        for gs, at, here in _row_slices(parts, rows):  # written in place into each backward pass's tensor
            flat = gs.reshape(gs.shape[0], -1)
            if self.coordinates is not None:
                flat[at, self.coordinates[which[here]].to(flat.device)] = self.gradient_norm
            else:
                flat[at] = (self.gradient_norm * self.directions[which[here]]).to(flat)  # type: ignore[index]

    def scores(self, kind: str = "sum") -> Array:
        """One score per canary, higher when it looks trained on.

        ``kind``: ``"sum"`` (the final update's projection) or ``"steps"`` (every step's likelihood ratio;
        needs noise and the sample rate given to :meth:`attach`).
        """
        if kind not in ("sum", "steps"):
            raise ValueError(f"kind={kind!r} is invalid: pass 'sum' or 'steps'.")
        if not self.projections:
            raise RuntimeError("no step recorded: call attach(optimizer) before training.")
        z = np.stack(self.projections)  # [steps, m]
        if kind == "sum":
            return z.sum(0)
        q, sigma = self.sample_rate, self.noise_multiplier
        if not (0 < q <= 1) or not sigma > 0:
            raise ValueError(
                f"the 'steps' score needs noise and the sample rate: got noise_multiplier={sigma}, sample_rate={q}. "
                "Fix: attach(optimizer, sample_rate=q), or use kind='sum' without noise."
            )
        # log(1 - q + q exp((z - 1/2) / sigma^2)), stable for large z
        return np.logaddexp(math.log1p(-q) if q < 1 else -np.inf, math.log(q) + (z - 0.5) / sigma**2).sum(0)


def _row_slices(parts: list[Tensor], rows: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``(tensor, its rows among rows, their places in rows)`` for each tensor of a list ``grad_sample``."""
    out, start = [], 0
    for g in parts:
        here = ((rows >= start) & (rows < start + g.shape[0])).nonzero().reshape(-1)
        if here.numel():
            out.append((g, (rows[here] - start).to(g.device), here))
        start += g.shape[0]
    return out


@dataclass
class AuditedRun:
    """What one audited training run shows.

    Attributes:
        model: the trained model (unwrapped).
        epsilon, noise_multiplier, delta: the accountant's (``inf`` and ``nan`` without privacy).
        train_accuracy, test_accuracy: on the training digits and the held-out digits.
        attack: the loss-threshold membership attack, training digits against held-out ones.
        one_run: the canary audit's lower bound on epsilon; included: the coins; canary_scores: ``-loss``.
        sample_rate, steps: the DP-SGD run's q and number of steps (``nan`` and 0 without privacy).
        canaries, digits: ``(inputs, labels)`` of all the canaries; ``(members, non-members)`` digits.
        gradient_canaries: the white-box canaries, if asked for; gradient_audit: their ``"sum"`` bound.
    """

    model: nn.Module
    epsilon: float
    noise_multiplier: float
    delta: float
    train_accuracy: float
    test_accuracy: float
    attack: AttackROC
    one_run: OneRunAudit
    included: Array
    canary_scores: Array
    sample_rate: float = math.nan
    steps: int = 0
    canaries: tuple[Tensor, Tensor] | None = None
    digits: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    gradient_canaries: GradientCanaries | None = None
    gradient_audit: OneRunAudit | None = None

    def gradient_audit_of(self, kind: str = "sum") -> OneRunAudit:
        """The one-run bound from the gradient canaries' ``kind`` score, at this run's delta and significance.

        Each call is a separate audit: report the one chosen in advance, or split the significance.
        """
        if self.gradient_canaries is None or self.gradient_audit is None:
            raise ValueError("this run has no gradient canaries: make it with audited_digits_run(gradient_canaries=m).")
        c, significance = self.gradient_canaries, self.gradient_audit.significance
        return audit_one_run(c.scores(kind), c.included, delta=self.delta, significance=significance)

    @property
    def canary_attack(self) -> AttackROC:
        """The same loss attack on the canaries: those trained on against those left out."""
        return attack_roc(self.canary_scores[self.included], self.canary_scores[~self.included])

    def calibrated_canary_attack(self, reference_models: list[nn.Module]) -> AttackROC:
        """:func:`~dpnotebook.audit.calibrated_attack` on the canaries (e.g. with the models of other seeds' runs)."""
        if self.canaries is None:
            raise ValueError("this run kept no canaries: make it with audited_digits_run.")
        x, y = self.canaries
        keep = torch.from_numpy(self.included)
        return calibrated_attack(self.model, reference_models, (x[keep], y[keep]), (x[~keep], y[~keep]))


def _accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def audited_digits_run(
    *,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    members: int = 500,
    canaries: int = 1000,
    gradient_canaries: int = 0,
    epochs: int = 30,
    batch_size: int = 128,
    max_grad_norm: float = 1.0,
    lr: float | None = None,
    hidden: int = 256,
    significance: float = 0.05,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> AuditedRun:
    """Train on ``members`` digits plus the included canaries, then attack and audit.

    >>> run = audited_digits_run(noise_multiplier=1.0, members=64, canaries=64, epochs=1, seed=0)
    >>> run.one_run.epsilon <= run.epsilon
    True

    Args:
        target_epsilon: train with DP-SGD at the sigma that spends this epsilon in ``epochs``.
        noise_multiplier: train with DP-SGD at this sigma instead (0: no noise). Neither: plain Adam.
        delta: the accountant's and the audit's delta.
        members: training digits; as many other digits are held out as the non-members.
        canaries: m, random-pixel canaries, each trained on with probability 1/2.
        gradient_canaries: white-box Dirac canaries on first-layer weights no digit reaches (DP-SGD only).
        epochs, batch_size, max_grad_norm, hidden: of the training and of the MLP.
        lr: of Adam without privacy (default 3e-3), of SGD with DP-SGD (default 2.0).
        significance: the audit's chance of being wrong.
        seed: seeds the model, the coins, the batches and the noise.
        device: where the model trains; data, coins, batches, attacks and audits stay on the CPU
            (the noise is drawn on ``device``: a GPU run does not repeat the CPU run's numbers).

    Raises:
        ValueError: an invalid argument (both ``target_epsilon`` and ``noise_multiplier``,
            too many ``members`` or ``gradient_canaries``, a ``device`` this machine lacks).
    """
    from dpnotebook.datasets import load_digits_tensors
    from dpnotebook.models import MLP
    from dpnotebook.privacy import PrivacyEngine, unwrap_model

    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError("both target_epsilon and noise_multiplier given: pass one (or neither for plain SGD).")
    private = target_epsilon is not None or noise_multiplier is not None
    if gradient_canaries and not private:
        raise ValueError(f"gradient_canaries={gradient_canaries} without DP-SGD: pass a noise_multiplier.")
    device = check_device(device)
    x_all, y_all = load_digits_tensors()[0].tensors
    if 2 * members > len(x_all):
        raise ValueError(f"members={members} is invalid: at most {len(x_all) // 2} (as many digits are held out).")
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed))
    x_in, y_in = x_all[order[:members]], y_all[order[:members]]
    x_out, y_out = x_all[order[members : 2 * members]], y_all[order[members : 2 * members]]
    x_can, y_can = random_image_canaries(canaries, seed=seed + 1, blank=(x_all == 0).all(0))  # pixels no digit uses
    included = draw_inclusion(canaries, seed=seed + 2)
    keep = torch.from_numpy(included)
    x_train, y_train = torch.cat([x_in, x_can[keep]]), torch.cat([y_in, y_can[keep]])
    ids = torch.full((len(y_train),), -1, dtype=torch.long)  # -1: an ordinary row; i: gradient canary i

    torch.manual_seed(seed)
    mlp = MLP(hidden=hidden)
    model: nn.Module = mlp
    grad_canaries = None
    if gradient_canaries:
        first = mlp.net[1]  # the MLP's first Linear layer
        assert isinstance(first, nn.Linear)
        free = unreached_coordinates(first.weight, torch.cat([x_in, x_can]))  # never the coins: only DP sees them
        if gradient_canaries > free.numel():
            raise ValueError(f"gradient_canaries={gradient_canaries}: only {free.numel()} first-layer weights free.")
        pick = torch.randperm(free.numel(), generator=torch.Generator().manual_seed(seed + 5))[:gradient_canaries]
        coins = draw_inclusion(gradient_canaries, seed=seed + 6)
        grad_canaries = GradientCanaries.dirac(first.weight, free[pick], coins, gradient_norm=10 * max_grad_norm)
        ids = torch.cat([ids, torch.from_numpy(np.flatnonzero(coins))])  # their rows: zero inputs, label 0
        x_train = torch.cat([x_train, x_train.new_zeros(int(coins.sum()), *x_train.shape[1:])])
        y_train = torch.cat([y_train, y_train.new_zeros(int(coins.sum()))])
    mlp.to(device)
    optimizer: torch.optim.Optimizer
    if private:
        optimizer = torch.optim.SGD(model.parameters(), lr=2.0 if lr is None else lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3 if lr is None else lr)
    # private: make_private replaces the shuffle by Poisson sampling, drawn with this generator
    loader = DataLoader(
        TensorDataset(x_train, y_train, ids),
        batch_size=batch_size,
        shuffle=not private,
        generator=torch.Generator().manual_seed(seed + 3),
    )
    epsilon, sigma, sample_rate, steps = math.inf, math.nan, math.nan, 0
    if private:
        engine = PrivacyEngine(accountant="pld", secure_mode=False)
        noise = torch.Generator(device=device).manual_seed(seed + 4)
        common: dict[str, Any] = dict(
            module=model, optimizer=optimizer, data_loader=loader, max_grad_norm=max_grad_norm, noise_generator=noise
        )
        if target_epsilon is not None:
            made = engine.make_private_with_epsilon(
                target_epsilon=target_epsilon, target_delta=delta, epochs=epochs, **common
            )
        else:
            assert noise_multiplier is not None  # private without a target epsilon
            made = engine.make_private(noise_multiplier=noise_multiplier, **common)
        model, optimizer, loader = made[:3]
        sample_rate, sigma = float(engine.sample_rate or math.nan), optimizer.noise_multiplier
        if grad_canaries is not None:
            grad_canaries.attach(optimizer, sample_rate=sample_rate)
    for _ in range(epochs):
        for xb, yb, ib in loader:
            optimizer.zero_grad()
            if len(yb):
                nn.functional.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
                if grad_canaries is not None:
                    grad_canaries.inject(ib)
            optimizer.step()
    if private:
        steps = sum(n for _, _, n in engine.accountant.history)
        epsilon = engine.get_epsilon(delta) if sigma > 0 else epsilon
    plain = (unwrap_model(model) if private else model).cpu()  # the attacks and audits run on the CPU
    plain.eval()
    scores = -example_losses(plain, x_can, y_can).numpy()
    return AuditedRun(
        model=plain,
        epsilon=epsilon,
        noise_multiplier=sigma,
        delta=delta,
        train_accuracy=_accuracy(plain, x_in, y_in),
        test_accuracy=_accuracy(plain, x_out, y_out),
        attack=loss_threshold_attack(plain, (x_in, y_in), (x_out, y_out)),
        one_run=audit_one_run(scores, included, delta=delta, significance=significance),
        included=included,
        canary_scores=scores,
        sample_rate=sample_rate,
        steps=steps,
        canaries=(x_can, y_can),
        digits=((x_in, y_in), (x_out, y_out)),
        gradient_canaries=grad_canaries,
        gradient_audit=None
        if grad_canaries is None
        else audit_one_run(grad_canaries.scores("sum"), grad_canaries.included, delta=delta, significance=significance),
    )
