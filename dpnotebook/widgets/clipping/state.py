"""The clipping explorer's state: a bound C, a clipping mode, and what clipping does to a batch.

All the clipping is done by :func:`dpnotebook.privacy.clip_and_sum`, the optimizer's function.

>>> import torch
>>> g = {"w": torch.tensor([[3.0, 4.0], [0.3, 0.4]])}
>>> s = ClippingState(g, max_grad_norm=1.0)
>>> stats = s.stats()
>>> stats.fraction_clipped, round(stats.cosine, 3), round(stats.norm_ratio, 3)
(0.5, 1.0, 0.273)
>>> s.max_grad_norm = -1
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: max_grad_norm=-1.0 is invalid: it must be a number > 0 ...
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

from dpnotebook.privacy import CLIPPING_MODES, clip_and_sum, layer_thresholds
from dpnotebook.privacy._arguments import check_choice
from dpnotebook.widgets._validate import bounded_cache, finite_c, library_check
from dpnotebook.widgets.grads import as_grad_samples, flatten_grad_samples

__all__ = ["ClippingStats", "ClippingState", "clipping_stats"]


@dataclass
class ClippingStats:
    """What clipping at one bound does to one batch.

    Attributes:
        max_grad_norm: the bound C.
        clipping: ``"flat"`` or ``"per_layer"``.
        fraction_clipped: fraction of samples scaled down.
        mean: the true mean gradient (unclipped), flattened, ``[D]``.
        clipped_mean: the mean of the clipped gradients, flattened, ``[D]``.
        cosine: cosine similarity of ``clipped_mean`` and ``mean`` (1 = same direction).
        norm_ratio: ``||clipped_mean|| / ||mean||`` (< 1: clipping shrank the update).
        norms: each sample's total norm, ``[B]``.
        factors: the clip factors, ``[B]`` (flat) or ``[L, B]`` (per layer).
        layer_threshold: the bound of each layer, ``C`` (flat) or ``C / sqrt(L)`` (per layer).
    """

    max_grad_norm: float
    clipping: str
    fraction_clipped: float
    mean: np.ndarray
    clipped_mean: np.ndarray
    cosine: float
    norm_ratio: float
    norms: np.ndarray
    factors: np.ndarray
    layer_threshold: float

    def label(self) -> str:
        """One line for the figure: fraction clipped and the clipping bias."""
        return (
            f"C = {self.max_grad_norm:.3g} ({self.clipping}): clipped {100 * self.fraction_clipped:.0f}% of samples"
            f"  |  cos(clipped mean, mean) = {self.cosine:.3f}"
            f"  |  |clipped mean| / |mean| = {self.norm_ratio:.3f}"
        )


def clipping_stats(grad_samples: Mapping[str, Tensor], max_grad_norm: float, clipping: str = "flat") -> ClippingStats:
    """Clip ``grad_samples`` with :func:`~dpnotebook.privacy.clip_and_sum` and measure the bias."""
    result = clip_and_sum(grad_samples, max_grad_norm=max_grad_norm, clipping=clipping)
    mean = flatten_grad_samples(grad_samples).double().mean(0).cpu().numpy()
    clipped_mean = torch.cat([s.flatten() for s in result.summed]).double().cpu().numpy() / result.batch_size
    na, nb = float(np.linalg.norm(clipped_mean)), float(np.linalg.norm(mean))
    return ClippingStats(
        max_grad_norm=float(max_grad_norm),
        clipping=clipping,
        fraction_clipped=result.fraction_clipped,
        mean=mean,
        clipped_mean=clipped_mean,
        cosine=float(clipped_mean @ mean / (na * nb)) if na > 0 and nb > 0 else math.nan,
        norm_ratio=na / nb if nb > 0 else math.nan,
        norms=result.norms.double().cpu().numpy(),
        factors=result.factors.double().cpu().numpy(),
        layer_threshold=max_grad_norm if clipping == "flat" else layer_thresholds(max_grad_norm, len(grad_samples)),
    )


class ClippingState(traitlets.HasTraits):
    """The bound C and the clipping mode, validated, over a fixed batch of per-sample gradients.

    Args:
        grad_samples: ``{name: [B, *shape]}`` (or a list of such tensors).
        max_grad_norm: the starting bound; by default the median per-sample norm.
        clipping: ``"flat"`` or ``"per_layer"``.
    """

    max_grad_norm = traitlets.Float(1.0)
    clipping = traitlets.Unicode("flat")

    def __init__(
        self,
        grad_samples: Mapping[str, Tensor] | list[Tensor],
        *,
        max_grad_norm: float | None = None,
        clipping: str = "flat",
    ) -> None:
        self.grad_samples = as_grad_samples(grad_samples)
        self.norms = clipping_stats(self.grad_samples, math.inf).norms
        if max_grad_norm is None:
            max_grad_norm = float(np.median(self.norms)) or 1.0
        super().__init__(max_grad_norm=max_grad_norm, clipping=clipping)
        self._cache: dict[tuple[float, str], ClippingStats] = {}
        self._curves: dict[str, dict[str, np.ndarray]] = {}

    @traitlets.validate("max_grad_norm")
    def _check_c(self, proposal: dict[str, Any]) -> float:
        return finite_c(proposal["value"])

    @traitlets.validate("clipping")
    def _check_clipping(self, proposal: dict[str, Any]) -> str:
        return library_check(check_choice, "clipping", proposal["value"], CLIPPING_MODES)

    @property
    def num_layers(self) -> int:
        """The number of parameter tensors L."""
        return len(self.grad_samples)

    @property
    def is_2d(self) -> bool:
        """``True`` when each per-sample gradient has two numbers (draw them as arrows)."""
        return sum(g[0].numel() for g in self.grad_samples.values()) == 2

    def norm_range(self) -> tuple[float, float]:
        """A range of C from well below the smallest norm to well above the largest."""
        positive_norms = self.norms[self.norms > 0]
        if positive_norms.size == 0:
            return 1e-3, 1.0
        return float(positive_norms.min()) / 10, float(positive_norms.max()) * 10

    def stats(self) -> ClippingStats:
        """:func:`clipping_stats` at the current bound and mode (cached)."""
        key = (self.max_grad_norm, self.clipping)
        return bounded_cache(self._cache, key, lambda: clipping_stats(self.grad_samples, *key))

    def curves(self, num: int = 40) -> dict[str, np.ndarray]:
        """Fraction clipped, cosine and norm ratio against C over :meth:`norm_range` (cached per mode)."""
        if self.clipping not in self._curves:
            grid = np.geomspace(*self.norm_range(), num)
            rows = [clipping_stats(self.grad_samples, float(c), self.clipping) for c in grid]
            self._curves[self.clipping] = {"C": grid} | {
                k: np.array([getattr(r, k) for r in rows]) for k in ("fraction_clipped", "cosine", "norm_ratio")
            }
        return self._curves[self.clipping]
