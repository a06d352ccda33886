"""What an attacker can tell: DP as a hypothesis test, membership attacks, and epsilon from one run.

(epsilon, delta)-DP bounds every attacker's TPR at each FPR (:func:`dp_tpr_bound`, :func:`gaussian_tpr`,
:func:`pld_tpr`); membership attacks on a trained model (:func:`loss_threshold_attack`,
:func:`calibrated_attack`) are measured by their ROC (:func:`attack_roc`) with error bars; and
:func:`audit_one_run` turns canary scores into a lower bound on epsilon (Steinke, Nasr & Jagielski
2023). docs/concepts/accounting.md ("What epsilon means to an attacker") gives the formulas.

>>> mu = gaussian_mu(sensitivity=1.0, noise_std=1.0)
>>> eps = gaussian_epsilon(mu, delta=1e-5)
>>> round(float(gaussian_tpr(0.05, mu)), 4), round(eps, 3)          # Phi(-1.645 + 1)
(0.2595, 4.377)
>>> bool(gaussian_tpr(0.05, mu) <= dp_tpr_bound(0.05, eps, 1e-5))
True
>>> fpr, tpr, e = 0.5, 0.9, 1.0                       # allowed by the first line, not by the second
>>> tpr <= math.exp(e) * fpr, 1 - tpr >= math.exp(-e) * (1 - fpr), round(float(dp_tpr_bound(fpr, e, 0.0)), 3)
(True, False, 0.816)
>>> roc = attack_roc([3.0, 2.0, 1.5], [1.0, 0.0, 1.6])
>>> round(roc.auc, 4), round(roc.advantage, 4), roc.tpr_at(0.0)
(0.8889, 0.6667, 0.6666666666666666)
>>> p = 0.05 ** (1 / 10)                     # closed form: p^10 = 0.05, epsilon = log(p / (1 - p))
>>> round(one_run_epsilon(canaries=100, guesses=10, correct=10), 4), round(math.log(p / (1 - p)), 4)
(1.0519, 1.0519)
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

from dpnotebook.privacy._arguments import check_positive_int, check_positive_number, check_sample_rate

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
        raise ValueError(
            f"{name} has {a.size} scores{' with NaN' if a.size else ''}: an attack needs at least one "
            "score per group and no NaN. Fix: score every member and non-member."
        )
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
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * norm.cdf(-mu / 2 - epsilon / mu))


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
            f"epsilon={epsilon!r}, delta={delta!r} are invalid: need epsilon >= 0 finite and "
            "0 <= delta <= 1. Fix: pass the accountant's (epsilon, delta)."
        )
    bound = np.minimum(math.exp(epsilon) * a + delta, 1 - math.exp(-epsilon) * (1 - a - delta))
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
    scale, flat, d = np.exp(eps)[:, None], a.reshape(-1)[None, :], deltas[:, None]
    lines = np.minimum(scale * flat + d, 1 - (1 - flat - d) / scale)
    return np.clip(lines.min(axis=0), 0.0, 1.0).reshape(a.shape)


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
    """The largest membership advantage ``TPR - FPR`` an ``(epsilon, delta)``-DP training allows (Humphries et al. 2020).

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

    ``loss_fn(output, targets)`` must give one value per record (``reduction="none"``; default
    cross-entropy); a wrapped model works too.

    >>> torch.manual_seed(0) and None
    >>> example_losses(nn.Linear(4, 2), torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])).shape
    torch.Size([6])
    """
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs has {inputs.shape[0]} records but targets has {targets.shape[0]}: pass one target per input."
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
            f"loss_fn returned shape {tuple(losses.shape)} for {inputs.shape[0]} records: it must give "
            "one loss per record (reduction='none')."
        )
    return losses


def loss_threshold_attack(
    model: nn.Module, members: Records, nonmembers: Records, *, loss_fn: LossFn = _cross_entropy
) -> AttackROC:
    """Score each record by ``-loss`` under ``model``: the ``(inputs, targets)`` trained on should score higher.

    ``nonmembers`` come from the same distribution, not trained on; ``loss_fn`` as :func:`example_losses`.
    """
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
    """Score each record by ``mean over reference models of loss_ref(x) - loss_target(x)``.

    The reference models are trained like the target on data from the same distribution that holds
    none of the records scored; other arguments as :func:`loss_threshold_attack`.

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
    mg = np.asarray(member_groups).reshape(-1)
    ng = np.asarray(nonmember_groups).reshape(-1)
    if mg.shape != roc.member_scores.shape or ng.shape != roc.nonmember_scores.shape:
        raise ValueError(
            f"{mg.size} member groups for {roc.member_scores.size} members and {ng.size} non-member groups for "
            f"{roc.nonmember_scores.size} non-members: pass one group per scored record, in the same order."
        )
    groups = sorted(set(mg.tolist()) & set(ng.tolist()))
    if not groups:
        raise ValueError("no group has both members and non-members: nothing to compare within a group.")
    return {int(g): attack_roc(roc.member_scores[mg == g], roc.nonmember_scores[ng == g]) for g in groups}


def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0) -> float:
    """How likely ``correct`` or more right out of ``guesses`` are, ``canaries`` each included on a coin, under (ε, δ)-DP.

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
    while excess(high) > 0:
        if high > 1e3:  # all right with a negligible delta term: refuted at any epsilon
            return math.inf
        high *= 2
    return float(brentq(excess, high / 2 if high > 1 else 0.0, high, xtol=1e-6))


def worst_case_correct(scores: Array, included: Array, k_in: int, k_out: int) -> int:
    """Right guesses of "in" for the ``k_in`` highest scores and "out" for the ``k_out`` lowest, ties broken worst.

    Which canaries of a tie group straddling a cut are guessed is not a function of the output, so
    there the guesses land on the wrong canaries first: the bound holds for any order and any ties
    (docs/guarantees.md, "Empirical bounds are sound for any input").

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
        canaries: m.
        guesses_in, guesses_out: ``k+`` and ``k-`` of the bound reported.
        correct: right guesses among them (ties counted at their worst, :func:`worst_case_correct`).
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
        significance: the chance that the bound is wrong, shared out over the pairs tried (Bonferroni).
        guesses: ``k+`` or ``(k+, k-)`` pairs to try (default :func:`default_guesses`); ties are
            counted at their worst (:func:`worst_case_correct`).

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
    alpha = _in_open_unit("significance", significance, "0.05") / len(pairs)
    best = None
    for k_in, k_out in pairs:
        right = worst_case_correct(s, inc, k_in, k_out)
        eps = one_run_epsilon(canaries=m, guesses=k_in + k_out, correct=right, delta=delta, significance=alpha)
        if best is None or eps > best.epsilon:
            best = OneRunAudit(eps, m, k_in, k_out, right, _check_delta(delta), significance, len(pairs))
    assert best is not None
    return best
