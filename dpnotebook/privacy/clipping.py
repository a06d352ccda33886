"""Per-sample gradient clipping: the step that bounds each sample's influence.

DP-SGD scales the gradient ``g_i`` of every sample ``i`` down to norm at most
``C`` (``max_grad_norm``) and sums the results. Adding or removing one sample
then changes the sum by a vector of norm at most ``C``: the *sensitivity* that
the Gaussian noise is calibrated to.

Two ways to measure "the norm":

* ``"flat"``: one norm over all parameters together,
  ``||g_i|| = sqrt(sum over parameters of ||g_i[p]||^2)``, and one clip factor
  ``min(1, C / (||g_i|| + 1e-6))`` per sample.
* ``"per_layer"``: each parameter tensor ("layer", as in Opacus) is clipped on
  its own to ``C / sqrt(L)`` where ``L`` is the number of parameter tensors.
  Then ``||clipped g_i||^2 <= L * C^2 / L = C^2``: the total norm, hence the
  sensitivity, is still at most ``C``.

>>> import torch
>>> g = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]   # one parameter of shape [2], B=2 samples
>>> result = clip_and_sum(g, max_grad_norm=1.0)
>>> result.norms                                   # before clipping
tensor([5.0000, 0.5000])
>>> result.summed[0]                               # [0.6, 0.8] + [0.3, 0.4]
tensor([0.9000, 1.2000])
>>> result.fraction_clipped
0.5
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dpnotebook.grad_sample.engine.precision import full_precision
from dpnotebook.grad_sample.samplers.sample_rows import flat_rows
from dpnotebook.privacy._arguments import check_choice, check_max_grad_norm
from dpnotebook.privacy.layer_bounds import check_layer_bounds, layer_bound_list, total_bound

__all__ = [
    "CLIPPING_MODES",
    "ClipResult",
    "per_layer_norms",
    "per_sample_norms",
    "clip_factors",
    "nonfinite_mask",
    "layer_thresholds",
    "clip_and_sum",
]

CLIPPING_MODES = ("flat", "per_layer")

#: Added to the norm before dividing, so that a zero gradient gives factor 1, not nan.
EPS = 1e-6

GradSamples = Sequence[Tensor] | Mapping[str, Tensor]


def _as_list(grad_samples: GradSamples) -> list[Tensor]:
    values = list(grad_samples.values()) if isinstance(grad_samples, Mapping) else list(grad_samples)
    values = [full_precision(g) for g in values]  # a bf16/fp16 norm can come out too small: clip in float32
    if not values:
        raise ValueError("grad_samples is empty: pass one [B, *shape] tensor per parameter.")
    rows = {g.shape[0] for g in values}
    if len(rows) > 1:
        raise ValueError(
            f"grad_samples disagree on the number of samples B (dim 0): {sorted(rows)}. Every "
            "parameter's per-sample gradient must come from the same batch."
        )
    return values


def per_layer_norms(grad_samples: GradSamples) -> Tensor:
    """The norm of each sample's gradient for each parameter tensor: shape ``[L, B]``.

    >>> import torch
    >>> per_layer_norms([torch.ones(2, 4), torch.ones(2, 3, 3)])
    tensor([[2., 2.],
            [3., 3.]])
    """
    return torch.stack([flat_rows(g).norm(dim=1) for g in _as_list(grad_samples)])


def per_sample_norms(grad_samples: GradSamples) -> Tensor:
    """The norm of each sample's whole gradient (all parameters flattened together): shape ``[B]``.

    >>> import torch
    >>> per_sample_norms([torch.ones(2, 4), torch.ones(2, 3, 3)])   # sqrt(4 + 9)
    tensor([3.6056, 3.6056])
    """
    return per_layer_norms(grad_samples).norm(dim=0)


def clip_factors(norms: Tensor, max_grad_norm: float) -> Tensor:
    """``min(1, max_grad_norm / (norm + 1e-6))`` for each norm: multiply a gradient by it to clip it.

    A norm that is NaN or infinite gets factor 0 (its sample must add nothing)
    and a :class:`~dpnotebook.errors.PrivacyWarning` that says how many there were.

    >>> import torch
    >>> clip_factors(torch.tensor([0.0, 0.5, 4.0]), 2.0)
    tensor([1.0000, 1.0000, 0.5000])
    """
    max_grad_norm = check_max_grad_norm(max_grad_norm)
    factors = (max_grad_norm / (norms + EPS)).clamp(max=1.0)
    finite = nonfinite_mask(norms)
    if finite is not None:
        from dpnotebook.errors import PrivacyWarning

        bad = ~finite if finite.dim() < 2 else (~finite).any(0)  # per-layer norms are [L, B]
        warnings.warn(
            f"{int(bad.sum())} sample(s) of {bad.numel()} have a NaN or infinite gradient norm; they get "
            "clip factor 0 and add nothing to this step. Check the loss and the inputs "
            "of those samples (an overflow, a log of 0).",
            PrivacyWarning,
            stacklevel=2,
        )
        factors = torch.where(finite, factors, torch.zeros_like(factors))
    return factors


def nonfinite_mask(norms: Tensor) -> Tensor | None:
    """``None`` if every norm is finite, else ``isfinite(norms)``.

    Norms are never negative, so they are all finite exactly when their sum is (or
    the sum overflowed, and the elementwise check then says so): one reduction and
    one synchronisation for the usual case, instead of the four kernels of
    ``isfinite`` and an ``all``.

    >>> import torch
    >>> nonfinite_mask(torch.tensor([1.0, 2.0])) is None, nonfinite_mask(torch.tensor([1.0, float("nan")]))
    (True, tensor([ True, False]))
    """
    if math.isfinite(float(norms.sum())):
        return None
    finite = torch.isfinite(norms)
    return None if bool(finite.all()) else finite


def _zero_nonfinite(g: Tensor, keep: Tensor) -> Tensor:
    """``g`` (``[B, ...]``) with the rows of samples not in ``keep`` (``[B]`` bool) set to 0 (0 * NaN is NaN)."""
    return torch.where(keep.reshape(-1, *([1] * (g.dim() - 1))), g, torch.zeros((), dtype=g.dtype, device=g.device))


def layer_thresholds(max_grad_norm: float, num_layers: int) -> float:
    """The per-layer bound ``C / sqrt(L)``: ``L`` layers clipped to it have total norm <= ``C``.

    >>> layer_thresholds(1.0, 4)
    0.5
    """
    return check_max_grad_norm(max_grad_norm) / math.sqrt(num_layers)


@dataclass
class ClipResult:
    """What :func:`clip_and_sum` computed, for the optimizer and for plots.

    Attributes:
        summed: the clipped per-sample gradients summed over the batch, one
            tensor of shape ``p.shape`` per parameter (in the order given).
        sensitivity: the largest change one sample can make to ``summed`` (= ``max_grad_norm``).
        norms: each sample's total gradient norm before clipping, shape ``[B]``.
        layer_norms: each sample's norm per parameter tensor before clipping, shape ``[L, B]``.
        factors: the clip factors: ``[B]`` for ``"flat"``, ``[L, B]`` for ``"per_layer"``.
        fraction_clipped: the fraction of samples whose gradient was scaled down
            (in any layer); 0.0 for an empty batch.
        clipping: ``"flat"`` or ``"per_layer"``.
    """

    summed: list[Tensor]
    sensitivity: float
    norms: Tensor
    layer_norms: Tensor
    factors: Tensor
    fraction_clipped: float
    clipping: str

    @property
    def batch_size(self) -> int:
        """The number of samples B that were clipped."""
        return int(self.norms.shape[0])


def clip_and_sum(
    grad_samples: GradSamples, *, max_grad_norm: float | Sequence[float], clipping: str = "flat"
) -> ClipResult:
    """Clip every sample's gradient to norm ``max_grad_norm`` and sum over the batch.

    Args:
        grad_samples: one tensor ``[B, *p.shape]`` per parameter (a list, or a
            dict whose values are used in order), e.g. ``[p.grad_sample for p in model.parameters()]``.
        max_grad_norm: the clipping bound C (> 0; ``math.inf`` disables clipping); with
            ``"per_layer"`` also a list of one bound per parameter tensor (Opacus), whose
            total ``sqrt(sum c_l^2)`` is the sensitivity (:mod:`~dpnotebook.privacy.layer_bounds`).
        clipping: ``"flat"`` (one norm over all parameters) or ``"per_layer"``
            (each parameter tensor clipped to ``C / sqrt(L)``, or to its own bound).

    Returns:
        A :class:`ClipResult`; its ``summed`` has one tensor per parameter.

    >>> import torch
    >>> g = [torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 4.0]])]   # 2 parameters, B=1
    >>> clip_and_sum(g, max_grad_norm=1.0, clipping="per_layer").summed   # each to 1/sqrt(2)
    [tensor([0.7071, 0.0000]), tensor([0.0000, 0.7071])]
    """
    check_choice("clipping", clipping, CLIPPING_MODES)
    bounds = check_layer_bounds(max_grad_norm, clipping)
    max_grad_norm = total_bound(bounds)
    grads = _as_list(grad_samples)
    layer_norms = per_layer_norms(grads)
    norms = layer_norms.norm(dim=0)
    finite = nonfinite_mask(norms)
    if finite is not None:  # a sample with a non-finite norm adds nothing: zero its rows, not only its factor
        grads = [_zero_nonfinite(g, finite) for g in grads]
    if clipping == "flat":
        factors = clip_factors(norms, max_grad_norm)
        clipped = factors < 1
        summed = [torch.tensordot(factors.to(g.dtype), g, dims=1) for g in grads]
    else:
        safe = layer_norms if finite is None else torch.where(finite, layer_norms, norms)
        factors = torch.stack(
            [clip_factors(n, c) for n, c in zip(safe, layer_bound_list(bounds, len(grads)), strict=True)]
        )
        clipped = (factors < 1).any(dim=0)
        summed = [torch.tensordot(f.to(g.dtype), g, dims=1) for f, g in zip(factors, grads, strict=True)]
    fraction = int(clipped.sum()) / clipped.numel() if clipped.numel() else 0.0
    return ClipResult(
        summed=summed,
        sensitivity=max_grad_norm,
        norms=norms,
        layer_norms=layer_norms,
        factors=factors,
        fraction_clipped=fraction,
        clipping=clipping,
    )
