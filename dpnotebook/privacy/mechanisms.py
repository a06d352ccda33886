"""The textbook mechanisms of differential privacy, to compute a guarantee by hand.

A mechanism ``M`` is ``(epsilon, delta)``-DP when for every pair of neighbouring datasets
``D``, ``D'`` and every set ``S`` of outputs ``P[M(D) in S] <= e^epsilon P[M(D') in S] + delta``
(Dwork & Roth 2014, Definition 2.4). Tutorial 03b computes each guarantee below by hand and
compares it with the accountants of :mod:`dpnotebook.privacy.accounting`; these functions are
the mechanisms it samples from and the two formulas it plots.

* :func:`randomized_response`: each person reports their bit truthfully with probability
  ``p_truth``, otherwise a fair coin (Warner 1965; Dwork & Roth, Section 3.2);
* :func:`laplace_mechanism`: a query plus Laplace noise of scale ``sensitivity / epsilon``,
  ``(epsilon, 0)``-DP (Dwork & Roth, Theorem 3.6);
* :func:`gaussian_mechanism`: a query plus Gaussian noise of std ``noise_std``; its exact
  ``delta(epsilon)`` is :func:`dpnotebook.audit.tradeoff.gaussian_delta`;
* :func:`amplified_by_subsampling`: the guarantee of an ``(epsilon, delta)``-DP mechanism run on a
  Poisson subsample of rate ``q`` (Balle, Barthe & Gaboardi 2018);
* :func:`gaussian_rdp`: the Rényi DP of the Gaussian mechanism, ``alpha / (2 sigma^2)`` (Mironov 2017).

>>> rng = np.random.default_rng(0)
>>> answers = randomized_response(np.ones(100_000, dtype=int), p_truth=0.5, rng=rng)
>>> round(float(answers.mean()), 2)                  # truth 1/2 + a coin that says 1 half the time
0.75
>>> eps, delta = amplified_by_subsampling(1.0, 1e-6, sample_rate=0.01)
>>> round(eps, 4), delta                              # ln(1 + 0.01 (e - 1))
(0.017, 1e-08)
"""

from __future__ import annotations

import math

import numpy as np

from dpnotebook.privacy._arguments import check_noise_multiplier, check_positive_number, check_sample_rate

__all__ = [
    "randomized_response",
    "laplace_mechanism",
    "gaussian_mechanism",
    "amplified_by_subsampling",
    "gaussian_rdp",
]


def _generator(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng={rng!r} is not a numpy Generator. Fix: pass rng=np.random.default_rng(seed), so that "
            "every draw of the mechanism is seeded and reproducible."
        )
    return rng


def randomized_response(bits: object, *, p_truth: float, rng: np.random.Generator) -> np.ndarray:
    """Each bit reported truthfully with probability ``p_truth``, otherwise replaced by a fair coin.

    Args:
        bits: the true answers, 0 or 1 (one per person).
        p_truth: the probability of reporting the truth, in [0, 1]; ``0.5`` is the coin-flip
            protocol of Dwork & Roth, Section 3.2.
        rng: the numpy Generator the coins are drawn from.

    Returns:
        The reported bits (an int array of the shape of ``bits``).

    Raises:
        ValueError: a bit is not 0 or 1, or ``p_truth`` is not in [0, 1].

    >>> randomized_response([0, 1, 1], p_truth=1.0, rng=np.random.default_rng(0)).tolist()
    [0, 1, 1]
    >>> randomized_response([2], p_truth=0.5, rng=np.random.default_rng(0))
    Traceback (most recent call last):
    ...
    ValueError: bits=[2] holds values other than 0 and 1. Fix: pass each person's true answer as 0 or 1.
    """
    rng = _generator(rng)
    truth = np.asarray(bits)
    if truth.size and not np.isin(truth, (0, 1)).all():
        raise ValueError(
            f"bits={bits!r} holds values other than 0 and 1. Fix: pass each person's true answer as 0 or 1."
        )
    if isinstance(p_truth, bool) or not isinstance(p_truth, (int, float)) or not 0 <= p_truth <= 1:
        raise ValueError(f"p_truth={p_truth!r} is invalid: it is a probability, in [0, 1]. Fix: pass e.g. p_truth=0.5.")
    truthful = rng.random(truth.shape) < p_truth
    coins = rng.integers(0, 2, size=truth.shape)
    return np.where(truthful, truth, coins).astype(int)


def laplace_mechanism(
    value: float | np.ndarray, *, sensitivity: float, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """``value`` plus Laplace noise of scale ``sensitivity / epsilon``: ``(epsilon, 0)``-DP.

    Args:
        value: the true answer of the query (a number or an array, one noisy copy per entry).
        sensitivity: the most the query's answer changes between neighbouring datasets (its
            L1 sensitivity); 1 for a count.
        epsilon: the privacy parameter, > 0.
        rng: the numpy Generator the noise is drawn from.

    Returns:
        The noisy answer(s), a float array.

    >>> noisy = laplace_mechanism(np.full(200_000, 10.0), sensitivity=1.0, epsilon=0.5, rng=np.random.default_rng(0))
    >>> round(float(np.mean(np.abs(noisy - 10.0))), 1)    # E|Laplace(b)| = b = 1 / 0.5
    2.0
    """
    rng = _generator(rng)
    scale = check_positive_number("sensitivity", sensitivity) / check_positive_number("epsilon", epsilon)
    centre = np.asarray(value, dtype=float)
    return centre + rng.laplace(0.0, scale, size=centre.shape)


def gaussian_mechanism(value: float | np.ndarray, *, noise_std: float, rng: np.random.Generator) -> np.ndarray:
    """``value`` plus Gaussian noise of std ``noise_std``.

    With a query of L2 sensitivity ``Delta`` it is ``(epsilon, delta)``-DP exactly when
    ``delta >= gaussian_delta(epsilon, mu=Delta / noise_std)`` (Balle & Wang 2018); a DP-SGD step
    without subsampling is this mechanism with ``Delta = C`` and ``noise_std = sigma C``.

    Args:
        value: the true answer(s).
        noise_std: the standard deviation of the noise, > 0.
        rng: the numpy Generator the noise is drawn from.

    Returns:
        The noisy answer(s), a float array.

    >>> round(float(np.std(gaussian_mechanism(np.zeros(100_000), noise_std=2.0, rng=np.random.default_rng(0)))), 2)
    2.0
    """
    rng = _generator(rng)
    std = check_positive_number("noise_std", noise_std)
    centre = np.asarray(value, dtype=float)
    return centre + rng.normal(0.0, std, size=centre.shape)


def amplified_by_subsampling(epsilon: float, delta: float, *, sample_rate: float) -> tuple[float, float]:
    """The guarantee of an ``(epsilon, delta)``-DP mechanism run on a Poisson sample of rate ``q``.

    Each record joins the sample with probability ``q`` independently; with neighbours that
    differ by adding or removing one record the result is
    ``(ln(1 + q (e^epsilon - 1)), q delta)``-DP (Balle, Barthe & Gaboardi 2018; Li, Qardaji &
    Su 2012): about ``q (e^epsilon - 1)`` for small ``q``. It holds for any mechanism. Applied to the
    Gaussian mechanism's exact epsilon at ``delta`` it is tight: for one step the PLD accountant
    gives the same epsilon at ``q delta`` (to about 1e-6). Over many steps the accountants compose
    the whole privacy loss distribution, and do far better than composing this one pair.

    Args:
        epsilon: the mechanism's epsilon on its input, >= 0.
        delta: its delta, in [0, 1].
        sample_rate: q, in (0, 1].

    Returns:
        ``(epsilon', delta')`` of the subsampled mechanism.

    >>> amplified_by_subsampling(2.0, 0.0, sample_rate=1.0)
    (2.0, 0.0)
    >>> amplified_by_subsampling(-1.0, 0.0, sample_rate=0.5)
    Traceback (most recent call last):
    ...
    ValueError: epsilon=-1.0 is invalid: it must be a finite number >= 0. Fix: pass the mechanism's own epsilon.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (0 <= epsilon < math.inf):
        raise ValueError(
            f"epsilon={epsilon!r} is invalid: it must be a finite number >= 0. Fix: pass the mechanism's own epsilon."
        )
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta <= 1:
        raise ValueError(f"delta={delta!r} is invalid: it must be in [0, 1]. Fix: pass the mechanism's own delta.")
    q = check_sample_rate(sample_rate)
    return float(math.log1p(q * math.expm1(epsilon))), float(q * delta)


def gaussian_rdp(alpha: float | np.ndarray, *, noise_multiplier: float) -> float | np.ndarray:
    """Rényi DP of the Gaussian mechanism at order ``alpha > 1``: ``alpha / (2 sigma^2)``.

    ``sigma`` is the noise std in units of the L2 sensitivity (DP-SGD's noise multiplier).
    Mironov (2017), among its basic mechanisms. Composing ``k`` such mechanisms adds their RDP:
    ``k alpha / (2 sigma^2)``.

    Args:
        alpha: the Rényi order(s), each > 1.
        noise_multiplier: sigma, > 0.

    Returns:
        The RDP at each order (a float for a number, an array for an array).

    >>> gaussian_rdp(2.0, noise_multiplier=1.0), gaussian_rdp(np.array([2.0, 11.0]), noise_multiplier=2.0).tolist()
    (1.0, [0.25, 1.375])
    """
    sigma = check_noise_multiplier(noise_multiplier)
    if sigma == 0:
        raise ValueError(
            "noise_multiplier=0 is invalid here: without noise the Gaussian mechanism has no finite RDP. "
            "Fix: pass the noise multiplier sigma > 0."
        )
    orders = np.asarray(alpha, dtype=float)
    if orders.size == 0 or np.isnan(orders).any() or orders.min() <= 1:
        raise ValueError(f"alpha={alpha!r} is invalid: Rényi orders must be > 1. Fix: pass e.g. alpha=2.0.")
    rdp = orders / (2 * sigma**2)
    return float(rdp) if orders.ndim == 0 else rdp
