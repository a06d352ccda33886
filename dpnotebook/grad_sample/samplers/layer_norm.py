"""Grad sampler for ``nn.LayerNorm`` (one or several trailing normalised dims), and its channels-first form.

``y = x_hat * weight + bias`` with ``x_hat`` the input normalised over the
trailing dims, so each sample's gradients are sums of ``backprop * x_hat`` and
``backprop`` over its K copies and every leading position.

:func:`channels_first_layer_norm_grad_sampler` is the same formula for a
``nn.LayerNorm`` subclass applied over dim 1 of ``[N, C, ...]`` (torchvision's and
ConvNeXt's ``LayerNorm2d``: permute to channels-last, layer-norm, permute back). Such
a subclass overrides ``forward``, so it does not inherit ``nn.LayerNorm``'s sampler,
and nothing but its author can say that its ``forward`` is this formula: it is
not registered for any class; register it for yours (``docs/real-models.md``):

>>> import torch
>>> import torch.nn.functional as F
>>> from torch import nn
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

from dpnotebook.grad_sample._contracts import affine_grads
from dpnotebook.grad_sample._registry import register_grad_sampler


@register_grad_sampler(nn.LayerNorm)
def layer_norm_grad_sampler(
    layer: nn.LayerNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias``."""
    x_hat = F.layer_norm(activations[0], layer.normalized_shape, eps=layer.eps)
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=the trailing len(normalized_shape) dims)
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)  # x_hat is ours


def channels_first_layer_norm_grad_sampler(
    layer: nn.LayerNorm, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of a ``nn.LayerNorm`` over dim 1 of ``[N, C, ...]`` (weight and bias ``[C]``).

    Raises:
        ValueError: ``layer.normalized_shape`` is not one dimension (the channels), or the input has no dim 2.
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
    # Must equal affine_reference_grads(x_hat, backprops, K, param_dims=(1,))
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=True, overwrite_x_hat=True)  # x_hat is ours


__all__ = ["layer_norm_grad_sampler", "channels_first_layer_norm_grad_sampler"]
