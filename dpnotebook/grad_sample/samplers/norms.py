"""Grad samplers for the normalisation layers: LayerNorm, GroupNorm, InstanceNorm, RMSNorm.

Each is an affine map ``y = x_hat * weight + bias`` after a normalisation without parameters,
so each sample's gradients are sums of ``backprop * x_hat`` and ``backprop`` over its K copies
and the positions the parameters are shared across
(:func:`~dpnotebook.grad_sample.samplers._contracts.affine_grads`); each sampler recomputes
``x_hat`` with PyTorch's own function. :func:`channels_first_layer_norm_grad_sampler` is the
formula of a ``nn.LayerNorm`` subclass over dim 1 of ``[N, C, ...]`` (``LayerNorm2d``): it
overrides ``forward``, so only its author can register it (``docs/real-models.md``):

>>> import torch
>>> from dpnotebook import register_grad_sampler
>>> from dpnotebook.testing import check_grad_sampler
>>> class MyLayerNorm2d(nn.LayerNorm):
...     def forward(self, x):
...         x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
...         return x.permute(0, 3, 1, 2)
>>> _ = register_grad_sampler(MyLayerNorm2d)(channels_first_layer_norm_grad_sampler)
>>> check_grad_sampler(MyLayerNorm2d(3), torch.randn(4, 3, 5, 5), K=2).ok
True
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, affine_grads

# In every sampler x_hat is a fresh tensor of ours, so affine_grads may overwrite it.


@register_grad_sampler(nn.LayerNorm)
def layer_norm_grad_sampler(layer: nn.LayerNorm, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """``nn.LayerNorm`` over one or several trailing dims: gradients of ``weight`` and ``bias``."""
    x_hat = F.layer_norm(activations[0], layer.normalized_shape, eps=layer.eps)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)


@register_grad_sampler(nn.RMSNorm)
def rms_norm_grad_sampler(layer: nn.RMSNorm, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """``nn.RMSNorm``, ``y = x / rms(x) * weight``: the gradient of ``weight``."""
    x_hat = F.rms_norm(activations[0], layer.normalized_shape, eps=layer.eps)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)


@register_grad_sampler(nn.GroupNorm)
def group_norm_grad_sampler(layer: nn.GroupNorm, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """``nn.GroupNorm``: per-channel affine (``[C]``) after per-group normalisation."""
    x_hat = F.group_norm(activations[0], layer.num_groups, eps=layer.eps)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)


@register_grad_sampler(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def instance_norm_grad_sampler(
    layer: nn.modules.instancenorm._InstanceNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> Grads:
    """Affine ``nn.InstanceNorm1d/2d/3d``: own statistics in training (or without running ones), else the running."""
    own_stats = layer.training or not layer.track_running_stats
    x_hat = F.instance_norm(
        activations[0],
        running_mean=None if own_stats else layer.running_mean,
        running_var=None if own_stats else layer.running_var,
        use_input_stats=own_stats,
        eps=layer.eps,
    )
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)


def channels_first_layer_norm_grad_sampler(
    layer: nn.LayerNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> Grads:
    """Per-sample gradients of a ``nn.LayerNorm`` over dim 1 of ``[N, C, ...]`` (weight and bias ``[C]``).

    Raises:
        ValueError: ``normalized_shape`` is not one dimension, or the input has no dim 2.
    """
    x = activations[0]
    if len(layer.normalized_shape) != 1 or x.dim() < 3:
        raise ValueError(
            f"channels_first_layer_norm_grad_sampler: {type(layer).__name__} has normalized_shape="
            f"{tuple(layer.normalized_shape)} and input of shape {tuple(x.shape)}; it handles a LayerNorm over "
            "dim 1 only (normalized_shape=(C,), input [N, C, ...]). Register layer_norm_grad_sampler for a "
            "LayerNorm over the trailing dims, or leave the layer unregistered (torch.func replays it)."
        )
    x_hat = F.layer_norm(x.movedim(1, -1), layer.normalized_shape, eps=layer.eps).movedim(-1, 1)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)


__all__ = [
    "layer_norm_grad_sampler",
    "rms_norm_grad_sampler",
    "group_norm_grad_sampler",
    "instance_norm_grad_sampler",
    "channels_first_layer_norm_grad_sampler",
]
