"""Grad sampler for ``nn.LayerNorm`` (one or several trailing normalised dims).

``y = x_hat * weight + bias`` with ``x_hat`` the input normalised over the
trailing dims, so each sample's gradients are sums of ``backprop * x_hat`` and
``backprop`` over its K copies and every leading position.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample.engine.registry import register_grad_sampler
from dpnotebook.grad_sample.samplers.sample_rows import affine_grads


@register_grad_sampler(nn.LayerNorm)
def layer_norm_grad_sampler(
    layer: nn.LayerNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias``."""
    x_hat = F.layer_norm(activations[0], layer.normalized_shape, eps=layer.eps)
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=the trailing len(normalized_shape) dims)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)  # x_hat is ours
