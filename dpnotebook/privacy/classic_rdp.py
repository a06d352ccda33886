"""The original RDP-to-(ε, δ) conversion, to compare ε with papers and tools that used it.

Rényi DP bounds a mechanism at each order α; converting to (ε, δ) takes a rule. The original one
(Mironov, 2017), which TF-Privacy reported with until 2020, is

    ε = min over α of  RDP(α) + log(1/δ) / (α - 1).

``dp_accounting`` (and so dpnotebook's ``"rdp"`` accountant) uses a tighter rule (Canonne, Kamath
and Steinke, 2020), so the same training gets a smaller ε. This module gives the original rule's ε
for the Poisson-subsampled Gaussian, from its RDP at integer orders (the binomial expansion of
Mironov, Talwar and Zhang, 2019), so that a tutorial can show where a published number comes from.
It is for comparison only: report the tighter ε.

>>> round(classic_rdp_epsilon(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14062, delta=1e-5), 2)
3.01
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def subsampled_gaussian_rdp(noise_multiplier: float, sample_rate: float, alpha: int) -> float:
    """RDP at integer order ``alpha >= 2`` of one step: Gaussian noise σ on a Poisson sample at rate q.

    ``log(Σ_k C(α, k) (1-q)^(α-k) q^k exp((k² - k) / (2σ²))) / (α - 1)``, summed in log space.

    >>> subsampled_gaussian_rdp(1.0, 1.0, 2)   # no subsampling: the Gaussian mechanism's α / (2σ²)
    1.0
    """
    if not (isinstance(alpha, int) and alpha >= 2):
        raise ValueError(f"alpha={alpha!r}: the binomial expansion needs an integer order >= 2.")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r} must be in (0, 1].")
    if sample_rate == 1:
        return alpha / (2 * noise_multiplier**2)
    terms = [
        math.lgamma(alpha + 1)
        - math.lgamma(k + 1)
        - math.lgamma(alpha - k + 1)
        + (alpha - k) * math.log1p(-sample_rate)
        + k * math.log(sample_rate)
        + (k * k - k) / (2 * noise_multiplier**2)
        for k in range(alpha + 1)
    ]
    top = max(terms)
    return (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)


def classic_rdp_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, orders: Iterable[int] = range(2, 65)
) -> float:
    """ε of ``steps`` subsampled Gaussian steps by the original conversion, minimised over integer ``orders``.

    Args:
        noise_multiplier: σ.
        sample_rate: q, each example's probability of joining a batch.
        steps: number of steps composed (RDP adds up).
        delta: δ in (0, 1).
        orders: integer Rényi orders >= 2 to minimise over.

    Returns:
        ``min_α steps · RDP(α) + log(1/δ) / (α - 1)``.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} must be in (0, 1).")
    return min(
        steps * subsampled_gaussian_rdp(noise_multiplier, sample_rate, a) + math.log(1 / delta) / (a - 1)
        for a in orders
    )
