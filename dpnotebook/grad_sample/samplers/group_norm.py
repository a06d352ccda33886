"""Grad sampler for ``nn.GroupNorm``: per-channel affine after per-group normalisation."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import affine_grads
from dpnotebook.grad_sample._registry import register_grad_sampler


@register_grad_sampler(nn.GroupNorm)
def group_norm_grad_sampler(
    layer: nn.GroupNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias`` (shape ``[C]``)."""
    x_hat = F.group_norm(activations[0], layer.num_groups, eps=layer.eps)
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=(1,))
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)  # x_hat is ours
