"""Differential privacy as a hypothesis test: what an attacker can and cannot tell apart.

An attacker sees one output of a mechanism and must say whether it came from a dataset
``D`` (without a record) or from its neighbour ``D'`` (with it). Any rule it uses has a
false positive rate ``FPR`` (says "with" on ``D``) and a true positive rate ``TPR`` (says
"with" on ``D'``). ``(epsilon, delta)``-DP is exactly the promise (Kairouz et al. 2015;
Dong, Roth & Su 2019) that every rule keeps

    ``TPR <= e^epsilon * FPR + delta``   and   ``1 - TPR >= e^-epsilon * (1 - FPR - delta)``,

:func:`dp_tpr_bound`. The second is the first applied to the opposite rule (say "with" exactly when
the first says "without"), whose FPR is ``1 - TPR`` and TPR ``1 - FPR``, with ``D`` and ``D'`` swapped.
The two lines cross at ``FPR = (1 - delta) / (e^epsilon + 1)``, where ``TPR - FPR`` is largest:
``(e^epsilon - 1 + 2 delta) / (e^epsilon + 1)`` (:func:`~dpnotebook.audit.roc.advantage_bound`). The best rule against the Gaussian mechanism (noise of std ``sigma``
on a query of sensitivity ``Delta``) is a threshold on the output; its ROC curve is the
trade-off curve ``TPR = Phi(Phi^-1(FPR) + mu)`` with ``mu = Delta / sigma``
(:func:`gaussian_tpr`). For a whole DP-SGD run, :func:`pld_tpr` reads the same curve from
``dp_accounting``'s privacy loss distribution: ``TPR(FPR) = min over epsilon of
delta(epsilon) + e^epsilon * FPR``.

>>> mu = gaussian_mu(sensitivity=1.0, noise_std=1.0)
>>> round(float(gaussian_tpr(0.05, mu)), 4)          # Phi(-1.645 + 1)
0.2595
>>> eps = gaussian_epsilon(mu, delta=1e-5)
>>> round(eps, 3)
4.377
>>> bool(gaussian_tpr(0.05, mu) <= dp_tpr_bound(0.05, eps, 1e-5))
True
>>> fpr, tpr, e = 0.5, 0.9, 1.0                       # allowed by the first line, not by the second
>>> tpr <= math.exp(e) * fpr, 1 - tpr >= math.exp(-e) * (1 - fpr), round(float(dp_tpr_bound(fpr, e, 0.0)), 3)
(True, False, 0.816)
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

__all__ = ["gaussian_mu", "gaussian_tpr", "gaussian_delta", "gaussian_epsilon", "dp_tpr_bound", "pld_tpr"]


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} is invalid: it must be a finite number > 0. Fix: pass e.g. {name}=1.0.")
    return float(value)


def _rates(name: str, values: float | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    if a.size and (np.isnan(a).any() or a.min() < 0 or a.max() > 1):
        raise ValueError(f"{name}={values!r} is invalid: rates must lie in [0, 1]. Fix: pass values in [0, 1].")
    return a


def gaussian_mu(*, sensitivity: float, noise_std: float) -> float:
    """``mu = sensitivity / noise_std``: how many noise standard deviations one record moves the output.

    >>> gaussian_mu(sensitivity=1.0, noise_std=0.5)
    2.0
    """
    return _positive("sensitivity", sensitivity) / _positive("noise_std", noise_std)


def gaussian_tpr(fpr: float | np.ndarray, mu: float) -> np.ndarray:
    """The best TPR at each FPR against the Gaussian mechanism: ``Phi(Phi^-1(FPR) + mu)``.

    The attacker says "with the record" when the output passes a threshold; ``mu = 0`` is
    the diagonal (no better than a coin).

    >>> gaussian_tpr(np.array([0.0, 0.5, 1.0]), 0.0).tolist()
    [0.0, 0.5, 1.0]
    >>> round(float(gaussian_tpr(0.5, 1.0)), 4)          # Phi(1)
    0.8413
    """
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"mu={mu!r} is invalid: it must be a finite number >= 0. Fix: mu = sensitivity / sigma.")
    return norm.cdf(norm.ppf(_rates("fpr", fpr)) + mu)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """The exact delta of the Gaussian mechanism at ``epsilon`` (Balle & Wang 2018):
    ``Phi(mu/2 - epsilon/mu) - e^epsilon * Phi(-mu/2 - epsilon/mu)``.

    >>> round(gaussian_delta(0.0, 1.0), 4)               # Phi(1/2) - Phi(-1/2)
    0.3829
    """
    mu = _positive("mu", mu)
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * norm.cdf(-mu / 2 - epsilon / mu))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which the Gaussian mechanism with this ``mu`` is ``(epsilon, delta)``-DP.

    Solves :func:`gaussian_delta` ``= delta``; ``dp_accounting.get_epsilon_gaussian`` gives the same.

    >>> round(gaussian_epsilon(1.0, 1e-5), 3)
    4.377
    >>> gaussian_epsilon(0.01, 0.5)                      # delta above delta(0): no epsilon needed
    0.0
    """
    mu = _positive("mu", mu)
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} is invalid: it must be in (0, 1). Fix: pass e.g. delta=1e-5.")
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2
    return float(brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, high, xtol=1e-10))


def dp_tpr_bound(fpr: float | np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The most TPR any attacker can have at each FPR against an ``(epsilon, delta)``-DP mechanism:
    ``min(1, e^epsilon FPR + delta, 1 - e^-epsilon (1 - FPR - delta))``.

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
    fpr: float | np.ndarray,
    *,
    noise_multiplier: float,
    sample_rate: float = 1.0,
    steps: int = 1,
    value_discretization_interval: float = 1e-3,
    epsilons: np.ndarray | None = None,
) -> np.ndarray:
    """The most TPR at each FPR against ``steps`` Poisson-subsampled Gaussian steps (a DP-SGD run).

    The trade-off curve is the lower envelope of the lines ``delta(epsilon) + e^epsilon FPR``
    (and their mirror images) over epsilon, with ``delta(epsilon)`` from ``dp_accounting``'s
    privacy loss distribution (pessimistic, so the curve errs upwards). With ``sample_rate=1``
    and one step it is the Gaussian curve with ``mu = 1 / noise_multiplier``.

    Args:
        fpr: false positive rates.
        noise_multiplier: sigma of the run (noise std / clipping bound C).
        sample_rate: Poisson sampling rate q.
        steps: number of DP-SGD steps.
        value_discretization_interval: the PLD grid step.
        epsilons: where the envelope is taken (default 400 points from 0 to 30).

    >>> a = np.array([0.01, 0.1, 0.5])
    >>> bool(np.abs(pld_tpr(a, noise_multiplier=1.0) - gaussian_tpr(a, 1.0)).max() < 2e-3)
    True
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    a = _rates("fpr", fpr)
    sigma = _positive("noise_multiplier", noise_multiplier)
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r} is invalid: it must be in (0, 1]. Fix: batch / dataset size.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is invalid: it must be an int >= 1.")
    dist = pld.from_gaussian_mechanism(
        sigma, sensitivity=1.0, sampling_prob=sample_rate, value_discretization_interval=value_discretization_interval
    )
    if steps > 1:
        dist = dist.self_compose(steps)
    eps = np.linspace(0.0, 30.0, 400) if epsilons is None else np.asarray(epsilons, dtype=float)
    deltas = np.asarray(dist.get_delta_for_epsilon(eps), dtype=float)
    scale = np.exp(eps)[:, None]
    flat = a.reshape(-1)[None, :]
    lines = np.minimum(scale * flat + deltas[:, None], 1 - (1 - flat - deltas[:, None]) / scale)
    return np.clip(lines.min(axis=0), 0.0, 1.0).reshape(a.shape)
