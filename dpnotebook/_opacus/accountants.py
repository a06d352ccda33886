"""Opacus' accountant names: ``opacus.accountants``, ``.utils`` and ``.analysis.rdp`` over dpnotebook's accounting.

``PRVAccountant`` is dpnotebook's PLD accountant (the same privacy loss distribution, by
``dp_accounting``); ``GaussianAccountant`` ("gdp") is refused: its central-limit approximation can
under-report epsilon. ``compute_rdp`` and ``get_privacy_spent`` are ``dp_accounting``'s RDP accountant.

>>> acc = RDPAccountant()
>>> acc.step(noise_multiplier=1.0, sample_rate=0.01)
>>> len(acc), acc.history
(1, [(1.0, 0.01, 1)])
>>> GaussianAccountant()
Traceback (most recent call last):
...
dpnotebook.errors.UnsupportedOptionError: accountant='gdp' is not supported: ...
>>> rdp = compute_rdp(q=0.01, noise_multiplier=1.1, steps=1000, orders=[2.0, 4.0, 8.0, 16.0, 32.0])
>>> eps, order = get_privacy_spent(orders=[2.0, 4.0, 8.0, 16.0, 32.0], rdp=rdp, delta=1e-5)
>>> round(eps, 1), order
(1.8, 8.0)
>>> 0.5 < get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, epochs=1) < 2.0
True
"""

from __future__ import annotations

from collections.abc import Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from dpnotebook.privacy._accounting import Accountant, PLDAccountant, RDPAccountant, create_accountant
from dpnotebook.privacy._accounting import get_noise_multiplier as _calibrate
from dpnotebook.privacy._engine import check_accountant_name

__all__ = [
    "IAccountant",
    "RDPAccountant",
    "PRVAccountant",
    "GaussianAccountant",
    "create_accountant",
    "get_noise_multiplier",
    "compute_rdp",
    "get_privacy_spent",
]

IAccountant = Accountant  #: Opacus' accountant interface.
PRVAccountant = PLDAccountant  #: Opacus' PRV accountant: dpnotebook's privacy-loss-distribution accountant.


class GaussianAccountant:
    """Opacus' GDP accountant: refused by design (see the module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        check_accountant_name("gdp")


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    epochs: int | None = None,
    steps: int | None = None,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """Opacus' signature (default ``accountant="rdp"``; ``epochs`` means ``epochs / sample_rate`` steps).

    It is :func:`dpnotebook.privacy.get_noise_multiplier`; Python refuses other keyword arguments by name.
    """
    return _calibrate(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        epochs=epochs,
        steps=steps,
        accountant=accountant,
        epsilon_tolerance=epsilon_tolerance,
    )


def compute_rdp(
    *, q: float, noise_multiplier: float, steps: int, orders: Sequence[float] | float
) -> np.ndarray | float:
    """RDP of ``steps`` Poisson-subsampled Gaussian mechanisms (rate ``q``), at each of ``orders``."""
    accountant = dp_accounting.rdp.RdpAccountant([float(a) for a in np.atleast_1d(orders)])
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier))
    rdp = getattr(accountant.compose(event, int(steps)), "_rdp", None)  # dp_accounting's composed RDP per order
    if rdp is None:
        raise RuntimeError(
            "this dp_accounting version does not expose the RDP per order; "
            "use dpnotebook.accountants.RDPAccountant (get_epsilon) instead."
        )
    rdp = np.asarray(rdp, dtype=float)
    return float(rdp[0]) if np.isscalar(orders) else rdp


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
