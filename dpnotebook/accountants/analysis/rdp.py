"""``opacus.accountants.analysis.rdp`` under dpnotebook: ``compute_rdp`` and ``get_privacy_spent``.

Both are computed by Google's ``dp_accounting``, as dpnotebook's own RDP
accountant is: ``compute_rdp`` composes ``steps`` Poisson-subsampled Gaussian
mechanisms in its :class:`~dp_accounting.rdp.RdpAccountant` and reads the RDP of
each order; ``get_privacy_spent`` is its RDP-to-(ε, δ) conversion
(``dp_accounting.rdp.compute_epsilon``), which returns ε and the order that gives it.

>>> rdp = compute_rdp(q=0.01, noise_multiplier=1.1, steps=1000, orders=[2.0, 4.0, 8.0, 16.0, 32.0])
>>> eps, order = get_privacy_spent(orders=[2.0, 4.0, 8.0, 16.0, 32.0], rdp=rdp, delta=1e-5)
>>> round(eps, 1), order
(1.8, 8.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant


def compute_rdp(
    *, q: float, noise_multiplier: float, steps: int, orders: Sequence[float] | float
) -> np.ndarray | float:
    """RDP of ``steps`` Poisson-subsampled Gaussian mechanisms (rate ``q``), at each of ``orders``."""
    scalar = np.isscalar(orders)
    order_list = [float(cast(float, orders))] if scalar else [float(a) for a in cast(Sequence[float], orders)]
    accountant = dp_accounting.rdp.RdpAccountant(order_list)
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)), int(steps)
    )
    rdp = getattr(accountant, "_rdp", None)  # dp_accounting keeps the composed RDP per order here
    if rdp is None:
        raise RuntimeError(
            "this dp_accounting version does not expose the RDP per order; "
            "use dpnotebook.accountants.RDPAccountant (get_epsilon) instead."
        )
    rdp = np.asarray(rdp, dtype=float)
    return float(rdp[0]) if scalar else rdp


def get_privacy_spent(
    *, orders: Sequence[float] | float, rdp: Sequence[float] | float, delta: float
) -> tuple[float, float]:
    """``(epsilon, best order)`` for the RDP ``rdp`` at ``orders`` and the target ``delta``.

    Raises:
        ValueError: ``orders`` and ``rdp`` have different lengths.
    """
    orders_vec, rdp_vec = np.atleast_1d(orders).astype(float), np.atleast_1d(rdp).astype(float)
    if len(orders_vec) != len(rdp_vec):
        raise ValueError(f"orders has {len(orders_vec)} entries and rdp {len(rdp_vec)}; give one RDP value per order.")
    eps, order = rdp_privacy_accountant.compute_epsilon(orders_vec, rdp_vec, delta)
    return float(eps), float(order)


__all__ = ["compute_rdp", "get_privacy_spent"]
