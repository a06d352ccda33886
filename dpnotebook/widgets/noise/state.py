"""The noise explorer's state: sigma, batch size and C over a pool of per-sample gradients.

Clipping is :func:`~dpnotebook.privacy.clip_and_sum` and noise :func:`~dpnotebook.privacy.gaussian_noise`
with std ``sigma * C``, as in the optimizer; the noisy averaged gradient is ``(clipped sum + noise) / B``.

>>> import torch
>>> s = NoiseState({"w": torch.randn(32, 2)}, noise_multiplier=1.0, batch_size=16, max_grad_norm=1.0)
>>> view = s.view()
>>> view.noisy.shape, round(view.noise_std, 4)        # 20 draws in 2-D; std sigma*C/B per coordinate
((20, 2), 0.0625)
>>> s.batch_size = 64
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: batch_size=64 is invalid: it must be an integer between 1 and 32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import traitlets
from torch import Tensor

from dpnotebook.privacy import clip_and_sum, gaussian_noise
from dpnotebook.privacy._arguments import check_noise_multiplier
from dpnotebook.widgets._validate import bounded_cache, finite_c, int_at_least, library_check
from dpnotebook.widgets.grads import as_grad_samples, flatten_grad_samples

__all__ = ["NoiseView", "NoiseState", "projection_basis"]


def projection_basis(direction: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """Two orthonormal rows ``[2, D]``: ``direction`` normalised and a seeded random vector
    orthogonal to it; in 2-D, the plane's own axes.

    >>> projection_basis(np.array([3.0, 4.0])).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    d = int(direction.shape[0])
    if d == 2:
        return np.eye(2)
    rng = np.random.default_rng(seed)
    u = direction / np.linalg.norm(direction) if np.linalg.norm(direction) > 0 else rng.standard_normal(d)
    u = u / np.linalg.norm(u)
    v = rng.standard_normal(d)
    v -= (v @ u) * u
    return np.stack([u, v / np.linalg.norm(v)])


@dataclass
class NoiseView:
    """One setting, projected to 2-D.

    Attributes:
        true_mean: the mean unclipped gradient of the batch, ``[2]``.
        clipped_mean: the mean clipped gradient, ``[2]``.
        noisy: the noisy averaged gradient for each draw, ``[draws, 2]``.
        noise_std: std of the averaged noise per coordinate, ``sigma * C / B``.
        snr: ``|clipped mean| / (sigma * C * sqrt(D) / B)`` (inf without noise), in all ``D`` dims.
        cosine: mean over draws of the cosine between the noisy and the true mean (all ``D`` dims).
        fraction_clipped: from the clipping.
    """

    true_mean: np.ndarray
    clipped_mean: np.ndarray
    noisy: np.ndarray
    noise_std: float
    snr: float
    cosine: float
    fraction_clipped: float


class NoiseState(traitlets.HasTraits):
    """sigma, B, C and the number of noise draws, validated, over a pool of per-sample gradients.

    Args:
        grad_samples: the pool, ``{name: [N, *shape]}``; a batch is its first ``B`` samples after a seeded shuffle.
        noise_multiplier: sigma.
        batch_size: B (default ``min(16, N)``).
        max_grad_norm: C (default: the median per-sample norm).
        draws: how many noise draws to show.
        seed: seeds the shuffle, the projection and the noise (draw ``j`` uses ``seed + j``).
    """

    noise_multiplier = traitlets.Float(1.0)
    batch_size = traitlets.Int(64)
    max_grad_norm = traitlets.Float(1.0)
    draws = traitlets.Int(20)

    def __init__(
        self,
        grad_samples: Mapping[str, Tensor] | list[Tensor],
        *,
        noise_multiplier: float = 1.0,
        batch_size: int | None = None,
        max_grad_norm: float | None = None,
        draws: int = 20,
        seed: int = 0,
    ) -> None:
        pool = as_grad_samples(grad_samples)
        self.pool_size = int(next(iter(pool.values())).shape[0])
        perm = torch.randperm(self.pool_size, generator=torch.Generator().manual_seed(seed))
        self.pool = {k: v[perm] for k, v in pool.items()}
        self.seed = seed
        self._cache: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, float]] = {}
        flat = flatten_grad_samples(self.pool).double()
        self.dim = flat.shape[1]
        self.basis = projection_basis(flat.mean(0).cpu().numpy(), seed=seed)
        if max_grad_norm is None:
            max_grad_norm = float(flat.norm(dim=1).median()) or 1.0
        batch_size = min(16, self.pool_size) if batch_size is None else batch_size
        super().__init__(
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, draws=draws, batch_size=batch_size
        )

    @traitlets.validate("noise_multiplier")
    def _check_sigma(self, proposal: dict[str, Any]) -> float:
        return library_check(check_noise_multiplier, proposal["value"])

    @traitlets.validate("max_grad_norm")
    def _check_c(self, proposal: dict[str, Any]) -> float:
        return finite_c(proposal["value"])

    @traitlets.validate("batch_size")
    def _check_b(self, proposal: dict[str, Any]) -> int:
        return int_at_least("batch_size", proposal["value"], 1, self.pool_size)

    @traitlets.validate("draws")
    def _check_draws(self, proposal: dict[str, Any]) -> int:
        return int_at_least("draws", proposal["value"], 1, 500)

    def _clipped(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, float]:
        """``(clipped sum, true mean, fraction clipped)`` of the first ``batch_size`` samples (cached)."""

        def clip() -> tuple[np.ndarray, np.ndarray, float]:
            batch = {k: v[:batch_size] for k, v in self.pool.items()}
            result = clip_and_sum(batch, max_grad_norm=self.max_grad_norm)
            summed = torch.cat([s.flatten() for s in result.summed]).double().cpu().numpy()
            return summed, flatten_grad_samples(batch).double().mean(0).cpu().numpy(), result.fraction_clipped

        return bounded_cache(self._cache, (batch_size, self.max_grad_norm), clip, limit=512)

    def _snr(self, summed: np.ndarray, b: int) -> float:
        noise_norm = self.noise_multiplier * self.max_grad_norm * math.sqrt(self.dim) / b
        return float(np.linalg.norm(summed / b) / noise_norm) if noise_norm > 0 else math.inf

    def view(self) -> NoiseView:
        """Clip the batch, add ``draws`` noise draws, average and project."""
        b, std = self.batch_size, self.noise_multiplier * self.max_grad_norm
        summed, true_mean, fraction = self._clipped(b)
        generators = (torch.Generator().manual_seed(self.seed + j) for j in range(self.draws))
        noise = np.stack(
            [gaussian_noise((self.dim,), std=std, generator=g, dtype=torch.float64).numpy() for g in generators]
        )
        noisy = (summed[None, :] + noise) / b
        norms = np.linalg.norm(noisy, axis=1) * np.linalg.norm(true_mean)
        return NoiseView(
            true_mean=self.basis @ true_mean,
            clipped_mean=self.basis @ (summed / b),
            noisy=noisy @ self.basis.T,
            noise_std=std / b,
            snr=self._snr(summed, b),
            cosine=float(np.mean(noisy @ true_mean / np.where(norms > 0, norms, np.inf))),
            fraction_clipped=fraction,
        )

    def snr_curve(self, num: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """``(batch sizes, SNR)``: signal-to-noise ratio against B at the current sigma and C."""
        sizes = np.unique(np.geomspace(1, self.pool_size, num).round().astype(int))
        snr = [self._snr(self._clipped(int(b))[0], int(b)) for b in sizes]
        return sizes, np.where(np.isinf(snr), np.nan, snr)
