"""How big the grid of ``dp_accounting``'s PLD accountant gets, estimated before it is built.

The privacy loss distribution of a Poisson-subsampled Gaussian step is held on
a grid of step ``value_discretization_interval`` spanning every loss the
mechanism reaches between ``dp_accounting``'s truncation points; ``n`` steps
are composed by an FFT over a wider grid. At a tiny ``sigma`` the loss range
is about ``1 / sigma**2``, so the grid needs gigabytes:
:class:`~dpnotebook.privacy.accounting.PLDAccountant` reads these estimates
and widens the interval to keep within its budget.

>>> f"{pld_grid_points(1e-3, 0.5, 1e-3):.2g}", round(composition_widening(0.5, 1000))
('5.1e+08', 317)
"""

from __future__ import annotations

import math

from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss

__all__ = ["pld_grid_points", "composition_widening"]


def pld_grid_points(noise_multiplier: float, sample_rate: float, interval: float) -> float:
    """How many grid points ``dp_accounting`` uses for one step's privacy loss distribution.

    The widest of the two (remove and add) distributions: the privacy loss range between
    ``dp_accounting``'s own truncation points, divided by ``interval``. Cheap: no grid is built.
    No noise or no sampling builds no grid (epsilon is infinite, or zero): 0.

    >>> round(pld_grid_points(1.0, 0.01, 1e-3))
    5654
    >>> f"{pld_grid_points(1e-3, 0.5, 1e-3):.2g}"
    '5.1e+08'
    """
    widest = 0.0
    if noise_multiplier == 0 or sample_rate == 0:
        return widest
    for adjacency in (AdjacencyType.REMOVE, AdjacencyType.ADD):
        loss = GaussianPrivacyLoss(noise_multiplier, sampling_prob=sample_rate, adjacency_type=adjacency)
        tail = loss.privacy_loss_tail()
        low, high = loss.privacy_loss(tail.upper_x_truncation), loss.privacy_loss(tail.lower_x_truncation)
        widest = max(widest, float(high - low))
    return widest / interval


def composition_widening(q: float, n: int) -> float:
    """About how many times wider than one step's grid the composition of ``n`` steps is (measured).

    Each step's loss spreads over its grid (``2 sqrt(n)``); at a small sigma it is two far-apart lumps,
    sampled or not, so the sum spreads with the binomial count of sampled steps (``16 sqrt(n q (1 - q))``).
    """
    return min(n, 1 + 2 * math.sqrt(n) + 16 * math.sqrt(n * q * (1 - q)))
