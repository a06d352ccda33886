"""Per-sample weight gradients of a convolution, a few samples at a time, into a reused buffer.

A convolution's weight is small next to its activations, so ghost mode forms
the per-sample weight gradients (``[B, *weight.shape]``) and takes their norms
and, later, their weighted sum. Two ways to form them, chosen by shape:

* ``"unfold"``: im2col (``F.unfold``) and one batched matrix product per chunk,
  ``[B, C_out, n] x [B, n, C_in*k*k]`` with ``n = K * positions``; the fastest
  for small images or few input channels (``Conv2d`` with ``groups=1``);
* ``"vmap"``: the ordinary weight gradient of each sample's ``K`` rows, batched
  with ``vmap`` (:func:`~dpnotebook.grad_sample.conv.conv_weight_grad_per_sample`);
  as fast as the batch's own weight gradient for large images.

Both write chunk by chunk into a buffer that the caller keeps from one step to
the next, so that no large tensor is allocated (and page-faulted) per step.

>>> import torch
>>> from torch import nn
>>> conv = nn.Conv2d(2, 3, 3, padding=1)
>>> x, g = torch.randn(4, 2, 5, 5), torch.randn(4, 3, 5, 5)
>>> out = torch.empty(2, 3, 2, 3, 3)
>>> a = conv_per_sample_grads(conv, x, g, K=2, out=out, method="unfold").clone()
>>> b = conv_per_sample_grads(conv, x, g, K=2, out=out, method="vmap")
>>> torch.allclose(a, b, atol=1e-5)
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample.conv import _explicit_padding, conv_weight_grad_per_sample

#: Bytes of scratch (im2col patches, vmap results) per chunk of samples.
CHUNK_BYTES = 8 * 2**20


def conv_method(layer: nn.modules.conv._ConvNd, positions: int) -> str:
    """``"unfold"`` or ``"vmap"`` for a layer whose output has ``positions`` pixels per row.

    >>> from torch import nn
    >>> conv_method(nn.Conv2d(32, 32, 3), 32 * 32), conv_method(nn.Conv2d(64, 128, 3), 8 * 8)
    ('vmap', 'unfold')
    """
    if not isinstance(layer, nn.Conv2d) or layer.groups != 1:
        return "vmap"
    patch = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    return "vmap" if positions >= 512 and patch >= 64 else "unfold"


def _unfold_chunk(layer: nn.Conv2d, x: Tensor, g: Tensor, K: int) -> Tensor:
    """``[b, C_out, C_in*kh*kw]``: per-sample gradients of ``b = rows/K`` samples by im2col."""
    pads = _explicit_padding(layer)
    if layer.padding_mode != "zeros" or pads[0::2] != pads[1::2]:
        x = F.pad(x, pads, mode="constant" if layer.padding_mode == "zeros" else layer.padding_mode)
        padding = (0, 0)
    else:
        padding = (pads[2], pads[0])
    U = F.unfold(x, layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)  # [r, CK, P]
    rows, CK, P = U.shape
    G = g.reshape(rows, g.shape[1], P)
    if K > 1:  # a sample's K rows become K*P positions of one product
        U = U.reshape(rows // K, K, CK, P).transpose(1, 2).reshape(rows // K, CK, K * P)
        G = G.reshape(rows // K, K, -1, P).transpose(1, 2).reshape(rows // K, -1, K * P)
    return torch.bmm(G, U.transpose(1, 2))


def conv_per_sample_grads(
    layer: nn.modules.conv._ConvNd, x: Tensor, g: Tensor, K: int, out: Tensor, method: str | None = None
) -> Tensor:
    """Each sample's weight gradient (sum over its K rows, not yet scaled) written into ``out``.

    Args:
        layer: the convolution.
        x: its input ``[B*K, C_in, ...]``; g: the backprops ``[B*K, C_out, ...]``.
        K: rows per sample.
        out: ``[B, *weight.shape]`` buffer; returned filled.
        method: ``"unfold"`` or ``"vmap"``; default :func:`conv_method`.
    """
    B = x.shape[0] // K
    method = method or conv_method(layer, g[0, 0].numel())
    weight = layer.weight[0].numel() * layer.out_channels
    if method == "unfold":  # the im2col patches of a sample's K rows
        per_sample = K * g[0, 0].numel() * layer.weight[0].numel() + weight
    else:
        per_sample = K * (x[0].numel() + g[0].numel()) + weight
    step = max(1, min(B, CHUNK_BYTES // max(1, per_sample * x.element_size())))
    flat = out.view(B, layer.out_channels, -1)
    for s in range(0, B, step):
        xs, gs = x[s * K : (s + step) * K], g[s * K : (s + step) * K]
        if method == "unfold":
            flat[s : s + step] = _unfold_chunk(layer, xs, gs, K)
        else:
            out[s : s + step] = conv_weight_grad_per_sample(layer, xs, gs, K) * K
    return out


__all__ = ["conv_per_sample_grads", "conv_method", "CHUNK_BYTES"]
