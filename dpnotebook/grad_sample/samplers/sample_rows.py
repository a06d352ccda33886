"""Rows and samples: the small tensor helpers every built-in sampler shares.

Every sampler receives tensors with the batch in dimension 0 holding ``B*K``
rows, sample-major. These helpers fold the ``K`` copies of a sample together
with everything else that is summed over (time steps, pixels), so that no
sampler ever builds ``B*K`` per-row gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn


def group_rows(t: Tensor, K: int) -> Tensor:
    """``[B*K, *rest] -> [B, K*prod(middle), last]`` for a trailing feature dim.

    >>> import torch
    >>> group_rows(torch.zeros(6, 5, 3), K=2).shape
    torch.Size([3, 10, 3])
    """
    middle = K * math.prod(t.shape[1:-1])  # explicit, so that an empty batch reshapes too
    return t.reshape(t.shape[0] // K, middle, t.shape[-1])


def flat_rows(g: Tensor) -> Tensor:
    """``[B, *shape] -> [B, prod(shape)]``: per-sample gradients as rows, for norms and weighted sums.

    Also for a 0-d parameter (``[B] -> [B, 1]``) and for no samples, where ``flatten(1)``
    and ``reshape(B, -1)`` fail.

    >>> import torch
    >>> flat_rows(torch.zeros(3)).shape, flat_rows(torch.zeros(0, 2, 2)).shape
    (torch.Size([3, 1]), torch.Size([0, 4]))
    """
    return g.reshape(g.shape[0], math.prod(g.shape[1:]))


def sum_rows(t: Tensor, K: int, keep: int) -> Tensor:
    """Sum over the K copies and every dim but the ``keep`` trailing ones, divide by K.

    ``[B*K, *middle, *kept] -> [B, *kept]``.

    >>> import torch
    >>> sum_rows(torch.ones(4, 7, 2, 3), K=2, keep=2)
    tensor([[[7., 7., 7.],
             [7., 7., 7.]],
    <BLANKLINE>
            [[7., 7., 7.],
             [7., 7., 7.]]])
    """
    split = t.dim() - keep
    middle = K * math.prod(t.shape[1:split])
    summed = t.reshape(t.shape[0] // K, middle, *t.shape[split:]).sum(1)
    return summed / K if K > 1 else summed


def affine_reference_grads(
    x_hat: Tensor, backprops: Tensor, K: int, param_dims: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """The reference form of every norm layer's affine part ``y = x_hat * weight + bias``.

    Sample ``b``'s weight gradient is the sum of ``x_hat * g`` over every position
    the parameter is shared across, averaged over the sample's ``K`` copies; its
    bias gradient is the same sum of ``g``. Neither input is changed.

    Args:
        x_hat: the normalised input, same shape as ``backprops``; ``B*K`` rows in dim 0.
        backprops: gradient of the loss w.r.t. ``y``.
        K: augmentation multiplicity.
        param_dims: the dims of ``x_hat`` the parameters span: ``(1,)`` for GroupNorm and
            InstanceNorm (``[C]``), the trailing ``len(normalized_shape)`` dims for
            LayerNorm and RMSNorm, e.g. ``(-2, -1)``.

    Returns:
        ``(weight_grads, bias_grads)``, each ``[B, *parameter shape]``.

    >>> import torch
    >>> x_hat, g = torch.tensor([[1.0, -1.0], [3.0, 1.0]]), torch.tensor([[2.0, 2.0], [1.0, 1.0]])  # 1 sample, K=2
    >>> affine_reference_grads(x_hat, g, K=2, param_dims=(-1,))
    (tensor([[ 2.5000, -0.5000]]), tensor([[1.5000, 1.5000]]))
    """
    spanned = {d % x_hat.dim() for d in param_dims}
    positions = [d for d in range(1, x_hat.dim()) if d not in spanned]

    def per_sample(t: Tensor) -> Tensor:  # [B*K, ...] -> sum over positions -> mean over the K copies
        per_row = t.sum(dim=positions) if positions else t  # (a sum over no dims would sum them all)
        return per_row.reshape(per_row.shape[0] // K, K, *per_row.shape[1:]).mean(1)

    return per_sample(x_hat * backprops), per_sample(backprops)


def affine_grads(
    layer: nn.Module, x_hat: Tensor, backprops: Tensor, K: int, channels_dim1: bool, *, overwrite_x_hat: bool = False
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``y = x_hat * weight + bias``, as in every norm layer: the fast form.

    Equal to :func:`affine_reference_grads`, for the parameters that are present and
    trainable; it sums positions without a channels-last copy and, with
    ``overwrite_x_hat``, forms ``x_hat * backprops`` in ``x_hat``'s own memory.

    Args:
        layer: holds ``weight`` and ``bias`` (either may be ``None`` or frozen).
        x_hat: the normalised input, same shape as ``backprops``.
        backprops: gradient of the loss w.r.t. ``y``; ``B*K`` rows.
        K: augmentation multiplicity.
        channels_dim1: the affine parameters span dim 1 (GroupNorm, InstanceNorm)
            rather than the trailing dims (LayerNorm, RMSNorm).
        overwrite_x_hat: ``x_hat`` is the caller's scratch: the product with ``backprops``
            is formed in it, saving a second activation-sized tensor.

    >>> import torch
    >>> from torch import nn
    >>> ln, x_hat, g = nn.LayerNorm(2), torch.ones(4, 2), torch.ones(4, 2)
    >>> affine_grads(ln, x_hat, g, K=2, channels_dim1=False)[ln.weight].tolist(), x_hat[0].tolist()
    ([[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0])
    """
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    ref = weight if weight is not None else bias
    if ref is None:
        return {}
    keep = ref.dim()

    def reduce(t: Tensor) -> Tensor:
        if channels_dim1:  # [rows, C, *positions]: positions summed in place, no channels-last copy
            return sum_rows(t.flatten(2).sum(2) if t.dim() > 2 else t, K, keep)
        return sum_rows(t, K, keep)

    out: dict[nn.Parameter, Tensor] = {}
    if weight is not None and weight.requires_grad:
        out[weight] = reduce(x_hat.mul_(backprops) if overwrite_x_hat else x_hat * backprops)
    if bias is not None and bias.requires_grad:
        out[bias] = reduce(backprops)
    return out


__all__ = ["group_rows", "flat_rows", "sum_rows", "affine_grads", "affine_reference_grads"]
