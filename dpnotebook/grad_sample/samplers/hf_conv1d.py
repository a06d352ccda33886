"""Hugging Face's ``Conv1D`` (GPT-2's attention and MLP projections): a linear map stored ``[in, out]``.

``transformers.pytorch_utils.Conv1D`` computes ``x @ weight + bias`` with
``weight`` of shape ``[in, out]``, the transpose of ``nn.Linear``'s. Without a
sampler, hooks and ghost mode replay each of them with ``torch.func`` (four units
per GPT-2 block). Here it gets what ``nn.Linear`` has, transposed:

* a grad sampler: sample ``b``'s weight gradient ``A_b^T G_b`` ``[in, out]``, its
  bias gradient ``sum_t g_t`` (:func:`conv1d_grad_sampler`);
* a norm sampler for ghost mode: the same Gram or settled norms as a linear layer
  (``||A_b^T G_b|| = ||G_b^T A_b||``), the clipped sum ``sum_b w_b A_b^T G_b`` in
  one matrix product (:func:`conv1d_group`).

``transformers`` is not a dependency: this module is imported, and registers
both, by :func:`~dpnotebook.grad_sample._registry.find_grad_sampler` as
soon as ``transformers.pytorch_utils`` has been imported (a model holding a
``Conv1D`` has imported it).

>>> import torch
>>> from transformers.pytorch_utils import Conv1D
>>> from dpnotebook.testing import check_grad_sampler
>>> check_grad_sampler(Conv1D(3, 4), torch.randn(5, 2, 4), K=1).ok
True
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from dpnotebook.grad_sample._contracts import (
    GhostCall,
    GhostGroup,
    Grads,
    Scratch,
    group_rows,
    register_norm_sampler,
    sum_rows,
)
from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers.linear_norm import LinearPiece, linear_piece, linear_settles, linear_weighted_sum


def _params(layer: nn.Module) -> tuple[nn.Parameter, nn.Parameter | None]:
    return cast(nn.Parameter, layer.weight), cast("nn.Parameter | None", getattr(layer, "bias", None))


@register_grad_sampler(Conv1D)
def conv1d_grad_sampler(layer: nn.Module, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of ``layer.weight`` (``[B, in, out]``) and ``layer.bias``."""
    weight, bias = _params(layer)
    out: Grads = {}
    if weight.requires_grad:
        a, g = group_rows(activations[0], K), group_rows(backprops, K)
        out[weight] = torch.einsum("bni,bno->bio", a, g) / K
    if bias is not None and bias.requires_grad:
        out[bias] = sum_rows(backprops, K, keep=1)
    return out


class Conv1DGroup(GhostGroup):
    """Every call of one ``Conv1D`` in a forward pass: a linear layer's norms, its sums transposed."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, piece: LinearPiece) -> None:
        self.weight, self.bias, self.piece = weight, bias, piece
        self.how = "ghost " + piece.strategy

    def sq_norms(self) -> Grads:
        out: Grads = {}
        if self.weight.requires_grad:
            out[self.weight] = self.piece.weight_sq_norms()
        if self.bias is not None and self.bias.requires_grad:
            out[self.bias] = self.piece.bias_grads().pow(2).sum(1)
        return out

    def weighted_sums(self, weights: Grads) -> Grads:
        piece, out = self.piece, {}
        if self.weight in weights:  # sum_b w_b A_b^T G_b: the linear sum with the roles of A and G swapped
            out[self.weight] = linear_weighted_sum(piece.G, piece.A, weights[self.weight] * piece.scale)
        if self.bias is not None and self.bias in weights:
            out[self.bias] = weights[self.bias].to(self.bias.dtype) @ piece.bias_grads()
        return out

    def drop(self, keep: Tensor) -> None:
        self.piece.drop(keep)


@register_norm_sampler(Conv1D, settles=linear_settles)
def conv1d_group(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``Conv1D``: the calls' positions side by side per sample (as ``linear_norm.linear_group``)."""
    weight, bias = _params(module)
    return Conv1DGroup(weight, bias, linear_piece([(c.activations()[0], c.received(), c.scale) for c in calls], K))


__all__ = ["conv1d_grad_sampler", "Conv1DGroup", "conv1d_group"]
