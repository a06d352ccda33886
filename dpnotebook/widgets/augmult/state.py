"""The augmentation-multiplicity explorer's state: K copies per sample, averaged.

For every ``K <= k_max``, per-sample gradients (each the mean over ``K`` copies) come from
:class:`~dpnotebook.GradSampleModule`, twice with independent augmentations; the augmentation
variance ``E ||g_i(draw a) - g_i(draw b)||^2 / 2`` shrinks like ``1/K``.

>>> s = AugmultState(k_max=4)
>>> s.K, len(s.table.norm)
(1, 4)
>>> bool(s.table.variance[-1] < s.table.variance[0])       # K=4 averages the noise away
True
>>> s.K = 0
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: K=0 is invalid: K is the number of augmented copies ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import traitlets
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.hooks import check_k
from dpnotebook.privacy import clip_and_sum, per_sample_norms
from dpnotebook.widgets._validate import bounded_cache, finite_c, int_at_least, library_check, refuse
from dpnotebook.widgets.augment import augment_copies
from dpnotebook.widgets.grads import LossFn, compute_grad_samples, flatten_grad_samples
from dpnotebook.widgets.toy import ToyMLP, bce_loss, make_blobs

__all__ = ["AugmultTable", "AugmultState"]

Augment = Callable[..., Tensor]


@dataclass
class AugmultTable:
    """Statistics for ``K = 1 .. k_max`` (index ``K - 1``).

    Attributes:
        norms: per-sample gradient norms, one ``[B]`` array per K.
        norm: mean per-sample norm per K.
        variance: augmentation variance of a sample's gradient per K.
        grad_samples: the per-sample gradients per K (draw a), by parameter name.
    """

    norms: list[np.ndarray]
    norm: np.ndarray
    variance: np.ndarray
    grad_samples: list[dict[str, Tensor]]


def _stats(model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn, augment: Augment, k_max: int) -> AugmultTable:
    norms, variance, grads = [], [], []
    for k in range(1, k_max + 1):
        ga, gb = (compute_grad_samples(model, augment(x, k, seed=seed), y, loss_fn, K=k) for seed in (0, 1))
        diff = flatten_grad_samples(ga).double() - flatten_grad_samples(gb).double()
        norms.append(per_sample_norms(ga).double().cpu().numpy())
        variance.append(float((diff.pow(2).sum(1) / 2).mean()))
        grads.append(ga)
    return AugmultTable(norms, np.array([n.mean() for n in norms]), np.array(variance), grads)


class AugmultState(traitlets.HasTraits):
    """K and C, validated, over per-sample gradients computed for every K up to ``k_max``.

    Args:
        model: the model (default: a small seeded MLP on the 2-D toy data).
        x: ``B`` samples (not yet augmented).
        y: their targets.
        loss_fn: ``loss_fn(output, targets)``, averaged.
        augment: ``augment(x, K, seed) -> [B*K, ...]`` sample-major copies (default: Gaussian noise of std 1).
        k_max: the largest K offered.
        K: the starting K.
        max_grad_norm: the starting C (default: the median norm at K=1).
    """

    K = traitlets.Int(1)
    max_grad_norm = traitlets.Float(1.0)

    def __init__(
        self,
        model: nn.Module | None = None,
        x: Tensor | None = None,
        y: Tensor | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        *,
        augment: Callable[..., Tensor] | None = None,
        k_max: int = 16,
        K: int = 1,
        max_grad_norm: float | None = None,
    ) -> None:
        if model is None:
            model, loss_fn = ToyMLP(16, seed=0), bce_loss
            if x is None:
                x, y = make_blobs(64, seed=0, outliers=0)
        if x is None or y is None or loss_fn is None:
            raise ValueError("pass x, y and loss_fn together with model.")
        self.k_max = int_at_least("k_max", k_max, 1, 64)
        augment = augment if augment is not None else partial(augment_copies, kind="noise", strength=1.0)
        self.table = _stats(model, x, y, loss_fn, augment, self.k_max)
        if max_grad_norm is None:
            max_grad_norm = float(np.median(self.table.norms[0])) or 1.0
        super().__init__(K=K, max_grad_norm=max_grad_norm)
        self._fractions: dict[float, np.ndarray] = {}

    @traitlets.validate("K")
    def _check_k(self, proposal: dict[str, Any]) -> int:
        k = library_check(check_k, proposal["value"])
        if k > self.k_max:
            refuse("K", k, f"it must be <= k_max={self.k_max} (the largest K computed).")
        return k

    @traitlets.validate("max_grad_norm")
    def _check_c(self, proposal: dict[str, Any]) -> float:
        return finite_c(proposal["value"])

    def fractions(self) -> np.ndarray:
        """Fraction of samples clipped at the current C, for every K (cached per C)."""
        c = self.max_grad_norm
        grads = self.table.grad_samples
        return bounded_cache(
            self._fractions, c, lambda: np.array([clip_and_sum(g, max_grad_norm=c).fraction_clipped for g in grads])
        )

    def norms(self) -> np.ndarray:
        """Per-sample norms at the current K."""
        return self.table.norms[self.K - 1]
