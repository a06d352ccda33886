"""Convolution weight gradients per sample: the formulas behind the ``nn.Conv*d`` grad sampler.

The weight gradient PyTorch computes for a batch is already a *sum over rows*.
So the per-sample gradient of sample ``i``, averaged over its ``K`` copies, is
the ordinary convolution weight gradient of the mini-batch made of those ``K``
rows, divided by ``K`` (:func:`conv_weight_grad_per_sample`, with ``vmap``).
:func:`unfold_patches` spells the same computation out (each output position's
input window); :func:`conv_weight_grad_grouped` gets every sample's gradient from
one grouped weight-gradient call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import vmap


def _explicit_padding(layer: nn.modules.conv._ConvNd) -> list[int]:
    """F.pad-style padding (last spatial dim first) equal to what the layer applies."""
    if layer.padding_mode != "zeros":  # the layer pads itself, then convolves with padding 0
        return list(layer._reversed_padding_repeated_twice)
    if layer.padding == "valid":
        return [0, 0] * len(layer.kernel_size)
    pads: list[int] = []
    for k, d, p in reversed(list(zip(layer.kernel_size, layer.dilation, _as_tuple(layer), strict=True))):
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
    for i, (k, s, d) in enumerate(zip(layer.kernel_size, layer.stride, layer.dilation, strict=True)):
        x = x.unfold(2 + i, d * (k - 1) + 1, s)  # window of span d*(k-1)+1, appended last
        if d > 1:
            x = x[..., ::d]
    return x


def padded_input(layer: nn.modules.conv._ConvNd, x: Tensor) -> tuple[Tensor, list[int]]:
    """``(input, padding)`` for ``convolution_backward`` to see what the layer saw.

    Symmetric zero padding is left to the kernel (no copy); any other padding
    (``'same'`` with an even kernel, reflect, circular...) is applied here.

    >>> import torch
    >>> from torch import nn
    >>> x = torch.zeros(1, 1, 4)
    >>> padded_input(nn.Conv1d(1, 1, 3, padding=1), x)[0].shape, padded_input(nn.Conv1d(1, 1, 3, padding=1), x)[1]
    (torch.Size([1, 1, 4]), [1])
    >>> padded_input(nn.Conv1d(1, 1, 3, padding=1, padding_mode="circular"), x)[0].shape
    torch.Size([1, 1, 6])
    """
    pads = _explicit_padding(layer)
    if layer.padding_mode == "zeros" and pads[0::2] == pads[1::2]:
        return x, pads[0::2][::-1]
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F.pad(x, pads, mode=mode), [0] * len(layer.kernel_size)


def conv_weight_grad_per_sample(layer: nn.modules.conv._ConvNd, x: Tensor, g: Tensor, K: int) -> Tensor:
    """``[B, *weight.shape]``: each sample's weight gradient, averaged over its K rows.

    >>> import torch
    >>> from torch import nn
    >>> conv = nn.Conv1d(1, 1, 2, bias=False)
    >>> x, g = torch.ones(2, 1, 3), torch.ones(2, 1, 2)   # one sample, K=2 copies
    >>> conv_weight_grad_per_sample(conv, x, g, K=2)
    tensor([[[[2., 2.]]]])
    """
    B, dims = x.shape[0] // K, len(layer.kernel_size)
    if B == 0:
        return x.new_zeros((0, *layer.weight.shape))
    x, padding = padded_input(layer, x)
    weight = layer.weight.detach().to(x.dtype)

    def one_sample(xs: Tensor, gs: Tensor) -> Tensor:  # xs: [K, C, ...], the sample's copies
        return torch.ops.aten.convolution_backward(
            gs,
            xs,
            weight,
            None,
            layer.stride,
            padding,
            layer.dilation,
            False,
            [0] * dims,
            layer.groups,
            [False, True, False],
        )[1]

    return vmap(one_sample)(x.unflatten(0, (B, K)), g.unflatten(0, (B, K))) / K


def conv_weight_grad_grouped(layer: nn.modules.conv._ConvNd, x: Tensor, g: Tensor, K: int) -> Tensor:
    """``[B, *weight.shape]``: each sample's weight gradient *summed* over its K rows, in one grouped call.

    The B samples become B groups of one convolution whose batch is the K
    copies: a single weight-gradient call of ``groups = B * layer.groups``
    returns every sample's gradient (the batch's own backward sums over K).

    >>> import torch
    >>> from torch import nn
    >>> conv = nn.Conv1d(1, 1, 2, bias=False)
    >>> conv_weight_grad_grouped(conv, torch.ones(2, 1, 3), torch.ones(2, 1, 2), K=2)
    tensor([[[[4., 4.]]]])
    """
    B, dims = x.shape[0] // K, len(layer.kernel_size)
    if B == 0:
        return x.new_zeros((0, *layer.weight.shape))
    x, padding = padded_input(layer, x)
    xs = x.unflatten(0, (B, K)).transpose(0, 1).reshape(K, -1, *x.shape[2:])  # [K, B*C_in, ...]
    gs = g.unflatten(0, (B, K)).transpose(0, 1).reshape(K, -1, *g.shape[2:])  # [K, B*C_out, ...]
    weight = layer.weight.detach().to(x.dtype)
    shape_only = weight.expand(B, *weight.shape).reshape(-1, *weight.shape[1:])
    grads = torch.ops.aten.convolution_backward(
        gs,
        xs,
        shape_only,
        None,
        layer.stride,
        padding,
        layer.dilation,
        False,
        [0] * dims,
        B * layer.groups,
        [False, True, False],
    )[1]
    return grads.view(B, *weight.shape)


__all__ = ["unfold_patches", "padded_input", "conv_weight_grad_per_sample", "conv_weight_grad_grouped"]
