"""Grad samplers for the units of :class:`~dpnotebook.layers.DPMultiheadAttention`.

``InProjection`` uses rows ``w0:w1`` of the packed in-projection weight: a linear layer's
sampler, its result placed at those rows. ``AppendBias`` appends ``bias_k`` or ``bias_v`` as one
more position: its gradient is the backprop there. Both average over each sample's ``K`` copies.

>>> import torch
>>> from dpnotebook.grad_sample import GradSampleModule
>>> from dpnotebook.layers import DPMultiheadAttention
>>> attn = DPMultiheadAttention(4, 2, batch_first=True, add_bias_kv=True)
>>> x = torch.randn(6, 3, 4)   # 2 samples x 3 copies
>>> out, _ = GradSampleModule(attn, K=3)(x, x, x)
>>> out.sum().backward()
>>> attn.in_proj_weight.grad_sample.shape, attn.bias_k.grad_sample.shape
(torch.Size([2, 12, 4]), torch.Size([2, 1, 1, 4]))
"""

from __future__ import annotations

from typing import Any

import torch
from opt_einsum import contract
from torch import Tensor

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, group_rows, sum_rows
from dpnotebook.units import AppendBias, InProjection


def _into_rows(full_shape: torch.Size, rows: tuple[int, int], g: Tensor) -> Tensor:
    """``g`` ``[B, r, ...]`` placed at ``rows`` of a zero ``[B, *full_shape]`` (no copy when it is all)."""
    if rows == (0, full_shape[0]):
        return g
    out = g.new_zeros(g.shape[0], *full_shape)
    out[:, rows[0] : rows[1]] = g
    return out


@register_grad_sampler(InProjection)
def in_projection_grad_sampler(unit: InProjection, activations: list[Any], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of the rows of ``weight`` and ``bias`` that this call used."""
    x, weight_rows, bias_rows = activations
    out: Grads = {}
    if unit.weight.requires_grad:
        g = contract("bno,bni->boi", group_rows(backprops, K), group_rows(x, K)) / K
        out[unit.weight] = _into_rows(unit.weight.shape, weight_rows, g)
    if unit.bias is not None and unit.bias.requires_grad:
        out[unit.bias] = _into_rows(unit.bias.shape, bias_rows, sum_rows(backprops, K, keep=1))
    return out


@register_grad_sampler(AppendBias)
def append_bias_grad_sampler(unit: AppendBias, activations: list[Any], backprops: Tensor, K: int) -> Grads:
    """The backprop at the appended position, averaged over each sample's K rows."""
    if not unit.bias.requires_grad:
        return {}
    last = sum_rows(backprops[:, -1], K, keep=1)  # [B, E]
    return {unit.bias: last.reshape(last.shape[0], *unit.bias.shape)}
