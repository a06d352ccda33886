"""Grad sampler for ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Conv3d``: cut out the windows, then the Linear formula.

A convolution applies one Linear map to every output position's input window (its *patch*),
per group of channels, so sample ``b``'s weight gradient is ``(1/K) sum_{copies, p} g_p patch_p^T``:
:func:`unfold_patches` (im2col as strided views) and one einsum (:func:`conv_weight_grads`).
The fast form (:func:`conv_grad_sampler_fast`) gives the same numbers in chunks of samples, by
im2col into one batched product (``"unfold"``) or one grouped weight-gradient call whose ``B``
groups are the samples (``"grouped"``), as :func:`conv_method` picks.

>>> from dpnotebook.testing import check_grad_sampler
>>> _ = torch.manual_seed(0)
>>> check_grad_sampler(nn.Conv2d(2, 4, 3, padding=1, groups=2), torch.randn(6, 2, 5, 5), K=3).ok
True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, scratch_bytes, sum_rows, weight_and_bias
from dpnotebook.grad_sample.samplers.linear import OutFor

Conv = nn.modules.conv._ConvNd


def _explicit_padding(layer: Conv) -> list[int]:
    """``F.pad``-style padding (last spatial dim first) equal to what the layer applies."""
    if layer.padding_mode != "zeros":  # the layer pads itself, then convolves with padding 0
        return list(layer._reversed_padding_repeated_twice)
    if layer.padding == "valid":
        return [0, 0] * len(layer.kernel_size)
    pads: list[int] = []
    numeric = layer.padding if isinstance(layer.padding, tuple) else (0,) * len(layer.kernel_size)
    for k, d, p in reversed(list(zip(layer.kernel_size, layer.dilation, numeric, strict=True))):
        total = d * (k - 1) if layer.padding == "same" else 2 * p
        pads += [total // 2, total - total // 2]
    return pads


def unfold_patches(x: Tensor, layer: Conv) -> Tensor:
    """``[N, C, *spatial] -> [N, C, *out_spatial, *kernel]``: each output position's input window.

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


def conv_weight_grads(layer: Conv, x: Tensor, g: Tensor, K: int) -> Tensor:
    """The formula: ``[B, *weight.shape]``, sample ``b``'s ``(1/K) sum_{copies, p} g_p patch_p^T`` per group.

    >>> conv = nn.Conv1d(1, 1, 2, bias=False)
    >>> x, g = torch.ones(2, 1, 3), torch.ones(2, 1, 2)   # one sample, K=2 copies, 2 positions
    >>> conv_weight_grads(conv, x, g, K=2)
    tensor([[[[2., 2.]]]])
    """
    B, G = x.shape[0] // K, layer.groups
    patches = unfold_patches(x, layer)  # [B*K, C_in, *positions, *kernel]
    P = math.prod(g.shape[2:])
    kernel = math.prod(layer.kernel_size)
    patches = patches.reshape(B, K, G, layer.in_channels // G, P, kernel)  # [b, k, group, in, position, kernel]
    g = g.reshape(B, K, G, layer.out_channels // G, P)  # [b, k, group, out, position]
    grads = torch.einsum("bkgop,bkgipq->bgoiq", g / K, patches)  # sum over the copies k and positions p
    return grads.reshape(B, *layer.weight.shape)


def conv_bias_grads(g: Tensor, K: int) -> Tensor:
    """``[B, C_out]``: the bias gradient, the backprops summed over positions and averaged over copies."""
    return sum_rows(g.flatten(2).sum(2), K, keep=1)


def conv_grad_sampler(layer: Conv, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of a convolution's weight and bias (any groups), by the formula."""
    x = activations[0]
    return weight_and_bias(
        layer, lambda: conv_weight_grads(layer, x, backprops, K), lambda: conv_bias_grads(backprops, K)
    )


#: Bytes of scratch per chunk of samples on the CPU, divided by K (memory does not grow with K) ...
CHUNK_BYTES = 8 * 2**20
#: ... but never below this (many small calls cost more).
MIN_CHUNK_BYTES = 2 * 2**20
#: On the CPU, a ``Conv2d`` with at most this many output positions per channel goes by im2col ...
UNFOLD_MAX_POSITIONS = 196
#: ... and so does one with at most this many input channels.
UNFOLD_MAX_IN_CHANNELS = 4
#: On another device, im2col while one row's patches hold at most this many numbers (docs/performance.md).
ACCELERATOR_UNFOLD_MAX_PATCH = 2**17


def conv_method(layer: Conv, x: Tensor, g: Tensor, K: int) -> str:
    """``"unfold"`` or ``"grouped"``: how :func:`conv_per_sample_grads` forms this layer's gradients.

    A fixed rule on the device and the shapes, measured where it decides (``docs/performance.md``):
    grouped convolutions always go grouped; see the constants above for the rest.

    >>> conv_method(nn.Conv1d(2, 3, 3), torch.randn(4, 2, 8), torch.randn(4, 3, 6), K=1)
    'grouped'
    >>> conv_method(nn.Conv2d(16, 32, 4, 2), torch.randn(4, 16, 13, 13), torch.randn(4, 32, 5, 5), K=1)
    'unfold'
    >>> conv_method(nn.Conv2d(16, 16, 3, padding=1), torch.randn(4, 16, 32, 32), torch.randn(4, 16, 32, 32), K=1)
    'grouped'
    """
    positions = math.prod(g.shape[2:])
    if layer.groups != 1:
        return "grouped"
    if x.device.type == "cpu":
        few = positions <= UNFOLD_MAX_POSITIONS or layer.in_channels <= UNFOLD_MAX_IN_CHANNELS
        return "unfold" if isinstance(layer, nn.Conv2d) and few else "grouped"
    patch = layer.in_channels * math.prod(layer.kernel_size) * positions
    return "unfold" if patch <= ACCELERATOR_UNFOLD_MAX_PATCH else "grouped"


def conv_weight_grads_grouped(layer: Conv, x: Tensor, g: Tensor, K: int) -> Tensor:
    """``[B, *weight.shape]``: each sample's weight gradient *summed* over its K rows, in one grouped call.

    >>> conv = nn.Conv1d(1, 1, 2, bias=False)
    >>> conv_weight_grads_grouped(conv, torch.ones(2, 1, 3), torch.ones(2, 1, 2), K=2)
    tensor([[[[4., 4.]]]])
    """
    B, dims = x.shape[0] // K, len(layer.kernel_size)
    pads = _explicit_padding(layer)
    if layer.padding_mode == "zeros" and pads[0::2] == pads[1::2]:  # symmetric zero padding: left to the kernel
        padding = pads[0::2][::-1]
    else:  # 'same' with an even kernel, reflect, circular...: padded here
        mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
        x, padding = F.pad(x, pads, mode=mode), [0] * dims
    xs = x.unflatten(0, (B, K)).transpose(0, 1).reshape(K, -1, *x.shape[2:])  # [K, B*C_in, ...]
    gs = g.unflatten(0, (B, K)).transpose(0, 1).reshape(K, -1, *g.shape[2:])  # [K, B*C_out, ...]
    weight = layer.weight.detach().to(x.dtype)
    shape_only = weight.expand(B, *weight.shape).reshape(-1, *weight.shape[1:])
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #                      output_padding, groups, output_mask): only the weight gradient is asked for
    options = (layer.stride, padding, layer.dilation, False, [0] * dims, B * layer.groups, [False, True, False])
    grads = torch.ops.aten.convolution_backward(gs, xs, shape_only, None, *options)[1]
    return grads.view(B, *weight.shape)


def _unfold_chunk(layer: Conv, x: Tensor, g: Tensor, K: int, out: Tensor, work: Tensor | None = None) -> Tensor:
    """``[b, C_out, C_in*k]`` into ``out``: :func:`conv_weight_grads` (unscaled) as one batched product.

    A sample's K rows' patches are copied once, side by side, into ``work`` when given.
    """
    d = len(layer.kernel_size)
    patches = unfold_patches(x, layer)  # [r, C, *out, *kernel]
    b, P, ck = x.shape[0] // K, math.prod(g.shape[2:]), layer.weight[0].numel()
    order = [0, 2, *range(3 + d, 3 + 2 * d), 1, *range(3, 3 + d)]  # [b, C, *kernel, K, *out]
    windows = patches.reshape(b, K, *patches.shape[1:]).permute(order)
    U = windows.reshape(b, ck, K * P) if work is None else work[:b].copy_(windows).view(b, ck, K * P)
    G = g.reshape(b, K, g.shape[1], P).transpose(1, 2).reshape(b, g.shape[1], K * P)
    return torch.bmm(G, U.transpose(1, 2), out=out)


def conv_per_sample_grads(
    layer: Conv,
    x: Tensor,
    g: Tensor,
    K: int,
    out: Tensor,
    method: str | None = None,
    workspace: Callable[[tuple[int, ...]], Tensor] | None = None,
) -> Tensor:
    """Each sample's weight gradient (summed over its K rows, unscaled) written into ``out`` ``[B, *weight.shape]``.

    Args:
        layer: the convolution; ``x``, ``g``: its input ``[B*K, C_in, ...]`` and backprops ``[B*K, C_out, ...]``.
        K: rows per sample.
        out: returned filled.
        method: ``"unfold"`` (no groups) or ``"grouped"``; default :func:`conv_method`.
        workspace: ``workspace(shape)`` gives a buffer kept between steps for one chunk's im2col patches.
    """
    B = x.shape[0] // K
    if B == 0:
        return out
    method = method or conv_method(layer, x, g, K)
    weight = layer.weight.numel()  # shapes only: indexing a tensor would cost an operation each
    if method == "unfold":  # the im2col patches of a sample's K rows
        per_sample = K * math.prod(g.shape[2:]) * (weight // layer.out_channels) + weight
    else:
        per_sample = K * (math.prod(x.shape[1:]) + math.prod(g.shape[1:])) + weight
    budget = scratch_bytes(max(CHUNK_BYTES // K, MIN_CHUNK_BYTES), x)
    step = max(1, min(B, budget // max(1, per_sample * x.element_size())))
    flat = out.view(B, layer.out_channels, -1)
    work = None
    if method == "unfold" and workspace is not None:
        work = workspace((step, layer.in_channels, *layer.kernel_size, K, *g.shape[2:]))
    for s in range(0, B, step):
        xs, gs = x[s * K : (s + step) * K], g[s * K : (s + step) * K]
        if method == "unfold":
            _unfold_chunk(layer, xs, gs, K, flat[s : s + step], work)
        else:
            out[s : s + step] = conv_weight_grads_grouped(layer, xs, gs, K)
    return out


def conv_grad_sampler_fast(
    layer: Conv, activations: list[Tensor], backprops: Tensor, K: int, out_for: OutFor | None = None
) -> Grads:
    """:func:`conv_grad_sampler`'s numbers by :func:`conv_per_sample_grads`, into ``out_for``'s tensor if given."""

    def weight() -> Tensor:
        x = activations[0]
        shape = (x.shape[0] // K, *layer.weight.shape)
        buf = backprops.new_empty(shape) if out_for is None else out_for(layer, shape, backprops)
        grads = conv_per_sample_grads(layer, x, backprops, K, buf)
        return grads.div_(K) if K > 1 else grads

    return weight_and_bias(layer, weight, lambda: conv_bias_grads(backprops, K))


register_grad_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d, fast=conv_grad_sampler_fast)(conv_grad_sampler)

__all__ = [
    "conv_grad_sampler",
    "conv_grad_sampler_fast",
    "conv_weight_grads",
    "conv_weight_grads_grouped",
    "conv_per_sample_grads",
    "conv_method",
    "unfold_patches",
]
