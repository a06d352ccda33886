"""Grad sampler for affine ``nn.InstanceNorm1d/2d/3d``.

The input is normalised with its own statistics in training (or always, when
running statistics are off) and with the running statistics in evaluation; we
recompute ``x_hat`` the same way, without touching the running buffers.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import affine_grads
from dpnotebook.grad_sample._registry import register_grad_sampler


@register_grad_sampler(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def instance_norm_grad_sampler(
    layer: nn.modules.instancenorm._InstanceNorm,
    activations: list[Tensor],
    backprops: Tensor,
    K: int,
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias`` (shape ``[C]``)."""
    own_stats = layer.training or not layer.track_running_stats
    x_hat = F.instance_norm(
        activations[0],
        running_mean=None if own_stats else layer.running_mean,
        running_var=None if own_stats else layer.running_var,
        use_input_stats=own_stats,
        eps=layer.eps,
    )
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=(1,))
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)  # x_hat is ours
