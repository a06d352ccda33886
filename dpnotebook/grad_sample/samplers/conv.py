"""Grad sampler for ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Conv3d``.

Sample ``i``'s weight gradient, averaged over its ``K`` copies, is the ordinary
convolution weight gradient of the mini-batch made of those ``K`` rows, divided
by ``K``: :mod:`~dpnotebook.grad_sample.samplers.conv_ops` has the formulas
(:func:`~dpnotebook.grad_sample.samplers.conv_ops.conv_weight_grad_per_sample` is the
reference form, batched with ``vmap``). No ``B*K`` per-row gradients are formed,
so memory grows with ``B``, not ``B*K``. For speed the sampler goes through one
seam, :func:`~dpnotebook.grad_sample.fast.conv.conv_per_sample_grads`: the same
gradients by im2col, a grouped call or ``vmap``, in chunks of samples, into a
buffer reused from step to step; the tests check it against the reference form
and the float64 oracle.

Checked against the float64 oracle, here with groups and padding, 2 samples of 3 copies:

>>> import torch
>>> from torch import nn
>>> from dpnotebook.testing import check_grad_sampler
>>> _ = torch.manual_seed(0)
>>> check_grad_sampler(nn.Conv2d(2, 4, 3, padding=1, groups=2), torch.randn(6, 2, 5, 5), K=3).ok
True
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import sum_rows
from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.fast.buffers import result_buffer
from dpnotebook.grad_sample.fast.conv import conv_per_sample_grads
from dpnotebook.grad_sample.samplers.conv_ops import (  # noqa: F401  (their old import path)
    conv_weight_grad_grouped,
    conv_weight_grad_per_sample,
    padded_input,
    unfold_patches,
)


@register_grad_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def conv_grad_sampler(
    layer: nn.modules.conv._ConvNd, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of a convolution's weight and bias (any groups)."""
    out: dict[nn.Parameter, Tensor] = {}
    x = activations[0]
    # torch's stubs type a convolution's weight and bias as Tensors; they are the layer's Parameters
    weight, bias = cast(nn.Parameter, layer.weight), cast("nn.Parameter | None", layer.bias)
    if weight.requires_grad and (x.requires_grad or backprops.requires_grad):  # double backward
        out[weight] = conv_weight_grad_per_sample(layer, x, backprops, K)
    elif weight.requires_grad:  # the fast seam: the method conv_method picks, into a reused buffer
        buf = result_buffer(layer, "weight", (x.shape[0] // K, *weight.shape), backprops)
        grads = conv_per_sample_grads(layer, x, backprops, K, buf)
        out[weight] = grads.div_(K) if K > 1 else grads
    if bias is not None and bias.requires_grad:
        per_row = backprops.flatten(2).sum(2)  # [rows, C_out]: positions first, no copy of the backprops
        out[bias] = sum_rows(per_row, K, keep=1)
    return out
