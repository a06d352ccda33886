"""Grad sampler for ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Conv3d``.

A convolution's weight gradient for one row is a sum over output positions of
``backprop[o, pos] * input_patch[c, window, pos]``. We cut the (padded) input
into the patches every output position sees (``Tensor.unfold`` along each
spatial dim, so 1-D, 2-D and 3-D share one code path, dilation included), then
contract over the ``K`` copies and all positions at once.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from opt_einsum import contract
from torch import Tensor, nn

from dpnotebook.grad_sample._contract import sum_rows
from dpnotebook.grad_sample.registry import register_grad_sampler


def _explicit_padding(layer: nn.modules.conv._ConvNd) -> list[int]:
    """F.pad-style padding (last spatial dim first) equal to what the layer applies."""
    if layer.padding_mode != "zeros":  # the layer pads itself, then convolves with padding 0
        return list(layer._reversed_padding_repeated_twice)
    if layer.padding == "valid":
        return [0, 0] * len(layer.kernel_size)
    pads: list[int] = []
    for k, d, p in reversed(list(zip(layer.kernel_size, layer.dilation, _as_tuple(layer)))):
        if layer.padding == "same":
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        else:
            pads += [p, p]
    return pads


def _as_tuple(layer: nn.modules.conv._ConvNd) -> tuple[int, ...]:
    p = layer.padding
    return p if isinstance(p, tuple) else (0,) * len(layer.kernel_size)


def unfold_patches(x: Tensor, layer: nn.modules.conv._ConvNd) -> Tensor:
    """``[N, C, *spatial] -> [N, C, *out_spatial, *kernel]``: each output position's input window.

    >>> import torch
    >>> from torch import nn
    >>> conv = nn.Conv2d(1, 1, kernel_size=2, stride=2)
    >>> unfold_patches(torch.arange(16.).reshape(1, 1, 4, 4), conv)[0, 0, 1, 1]
    tensor([[10., 11.],
            [14., 15.]])
    """
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    x = F.pad(x, _explicit_padding(layer), mode=mode)
    for i, (k, s, d) in enumerate(zip(layer.kernel_size, layer.stride, layer.dilation)):
        x = x.unfold(2 + i, d * (k - 1) + 1, s)  # window of span d*(k-1)+1, appended last
        if d > 1:
            x = x[..., ::d]
    return x


@register_grad_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def conv_grad_sampler(
    layer: nn.modules.conv._ConvNd, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of a convolution's weight and bias (any groups)."""
    out: dict[nn.Parameter, Tensor] = {}
    n, c_out = backprops.shape[:2]
    B, g = n // K, layer.groups
    if layer.weight.requires_grad:
        dims = len(layer.kernel_size)
        patches = unfold_patches(activations[0], layer)  # [n, C_in, *pos, *kernel]
        positions = math.prod(patches.shape[2 : 2 + dims])
        taps = math.prod(layer.kernel_size)
        c_in = patches.shape[1]
        patches = patches.reshape(B, K, g, c_in // g, positions, taps)
        grads = backprops.reshape(B, K, g, c_out // g, positions)
        w = contract("bkgcpt,bkgop->bgoct", patches, grads) / K
        out[layer.weight] = w.reshape(B, *layer.weight.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = sum_rows(backprops.movedim(1, -1), K, keep=1)
    return out
