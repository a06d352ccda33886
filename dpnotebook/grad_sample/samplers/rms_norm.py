"""Grad sampler for ``nn.RMSNorm``: ``y = x / rms(x) * weight``."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import affine_grads
from dpnotebook.grad_sample._registry import register_grad_sampler


@register_grad_sampler(nn.RMSNorm)
def rms_norm_grad_sampler(
    layer: nn.RMSNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradient of ``layer.weight``."""
    x_hat = F.rms_norm(activations[0], layer.normalized_shape, eps=layer.eps)
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=the trailing len(normalized_shape) dims)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)  # x_hat is ours
