"""Grad sampler for ``nn.Linear`` (any number of leading dims).

For one row with activations ``a_t`` and backprops ``g_t`` at positions ``t``,
the weight gradient is ``sum_t g_t a_t^T``. Averaging over the ``K`` copies of
a sample folds the copies into the same sum, so one contraction over
``n = K*T`` positions, ``[B, n, out] x [B, n, in] -> [B, out, in]``, gives every
sample's gradient at once (:func:`linear_weight_grads`). The sampler runs the same
product through the fast seam (:mod:`~dpnotebook.grad_sample.fast.linear`), which
writes into a buffer reused from step to step; the tests check both forms against
the float64 oracle.

>>> import torch
>>> a, g = torch.ones(2, 3), torch.ones(2, 1)     # one sample, K=2 copies
>>> linear_weight_grads(a, g, K=2)
tensor([[[1., 1., 1.]]])
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import group_rows, sum_rows
from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.fast.linear import linear_weight_grads_into_buffer


def linear_weight_grads(activations: Tensor, backprops: Tensor, K: int) -> Tensor:
    """The reference form: ``[B, out, in]``, sample ``b``'s ``(1/K) sum_{copies, t} g_t a_t^T``."""
    a, g = group_rows(activations, K), group_rows(backprops, K)
    return torch.einsum("bno,bni->boi", g, a) / K


@register_grad_sampler(nn.Linear)
def linear_grad_sampler(
    layer: nn.Linear, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias``."""
    out: dict[nn.Parameter, Tensor] = {}
    a = activations[0]
    # torch's stubs type Linear.weight and .bias as Tensors; they are the layer's Parameters
    weight, bias = cast(nn.Parameter, layer.weight), cast("nn.Parameter | None", layer.bias)
    if weight.requires_grad:
        if a.requires_grad or backprops.requires_grad:  # double backward: keep the graph, no buffer
            out[weight] = linear_weight_grads(a, backprops, K)
        else:
            out[weight] = linear_weight_grads_into_buffer(layer, a, backprops, K)
    if bias is not None and bias.requires_grad:
        out[bias] = sum_rows(backprops, K, keep=1)
    return out


__all__ = ["linear_grad_sampler", "linear_weight_grads"]
