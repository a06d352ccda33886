"""Grad sampler for ``nn.Linear`` (any number of leading dims).

For one row with activations ``a_t`` and backprops ``g_t`` at positions ``t``,
the weight gradient is ``sum_t g_t a_t^T``. Averaging over the ``K`` copies of
a sample folds the copies into the same sum, so a single batched contraction
``[B, n, out] x [B, n, in] -> [B, out, in]`` with ``n = K*T`` gives the result,
written into a buffer reused from step to step (:mod:`~dpnotebook.grad_sample._reuse`).
"""

from __future__ import annotations

import torch
from opt_einsum import contract
from torch import Tensor, nn

from dpnotebook.grad_sample._contract import group_rows, sum_rows
from dpnotebook.grad_sample._reuse import result_buffer
from dpnotebook.grad_sample.registry import register_grad_sampler


@register_grad_sampler(nn.Linear)
def linear_grad_sampler(
    layer: nn.Linear, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``layer.weight`` and ``layer.bias``."""
    out: dict[nn.Parameter, Tensor] = {}
    if layer.weight.requires_grad:
        a = group_rows(activations[0], K)
        g = group_rows(backprops, K)
        if g.requires_grad or a.requires_grad:  # double backward: keep the graph
            out[layer.weight] = contract("bno,bni->boi", g, a) / K
        else:
            buf = result_buffer(layer, "weight", (a.shape[0], g.shape[2], a.shape[2]), g)
            grads = torch.bmm(g.transpose(1, 2), a, out=buf)
            out[layer.weight] = grads.div_(K) if K > 1 else grads
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = sum_rows(backprops, K, keep=1)
    return out
