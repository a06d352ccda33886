"""Grad sampler for ``nn.Linear`` (any number of leading dims).

For one row with activations ``a_t`` and backprops ``g_t`` at positions ``t``, the weight
gradient is ``sum_t g_t a_t^T``. A sample's ``K`` copies fold into the same sum, so one
contraction over ``n = K*T`` positions, ``[B, n, out] x [B, n, in] -> [B, out, in]``, gives every
sample's gradient (:func:`linear_weight_grads`). The fast form is the same contraction as
``torch.bmm`` with ``1/K`` applied in place.

>>> import torch
>>> a, g = torch.ones(2, 3), torch.ones(2, 1)     # one sample, K=2 copies
>>> linear_weight_grads(a, g, K=2)
tensor([[[1., 1., 1.]]])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, group_rows, sum_rows, weight_and_bias

#: ``out_for(layer, shape, like)``: the tensor a fast form writes its result into.
OutFor = Callable[[nn.Module, tuple[int, ...], Tensor], Tensor]


def linear_weight_grads(activations: Tensor, backprops: Tensor, K: int) -> Tensor:
    """``[B, out, in]``: sample ``b``'s ``(1/K) sum_{copies, t} g_t a_t^T``."""
    a, g = group_rows(activations, K), group_rows(backprops, K)  # [B, n, in], [B, n, out]
    return torch.einsum("bno,bni->boi", g / K, a)  # 1/K on the backprops: the smaller tensor, as a rule


def linear_grad_sampler(layer: nn.Linear, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias``."""
    return weight_and_bias(
        layer, lambda: linear_weight_grads(activations[0], backprops, K), lambda: sum_rows(backprops, K, keep=1)
    )


def linear_grad_sampler_fast(
    layer: nn.Linear, activations: list[Tensor], backprops: Tensor, K: int, out_for: OutFor | None = None
) -> Grads:
    """:func:`linear_grad_sampler`'s numbers as one batched product, into ``out_for``'s tensor if given."""

    def weight() -> Tensor:
        a, g = group_rows(activations[0], K), group_rows(backprops, K)
        buf = None if out_for is None else out_for(layer, (a.shape[0], g.shape[2], a.shape[2]), g)
        grads = torch.bmm(g.transpose(1, 2), a, out=buf)
        return grads.div_(K) if K > 1 else grads

    return weight_and_bias(layer, weight, lambda: sum_rows(backprops, K, keep=1))


register_grad_sampler(nn.Linear, fast=linear_grad_sampler_fast)(linear_grad_sampler)

__all__ = ["linear_grad_sampler", "linear_grad_sampler_fast", "linear_weight_grads"]
