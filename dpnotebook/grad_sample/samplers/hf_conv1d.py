"""Hugging Face's ``Conv1D`` (GPT-2's attention and MLP projections): a linear map stored ``[in, out]``.

``transformers.pytorch_utils.Conv1D`` computes ``x @ weight + bias``, its weight the transpose of
``nn.Linear``'s. It gets a grad sampler (sample ``b``'s ``A_bᵀ G_b``, :func:`conv1d_grad_sampler`)
and a norm sampler: a linear layer's norms (``‖A_bᵀ G_b‖ = ‖G_bᵀ A_b‖``), its clipped sum
transposed (:func:`conv1d_group`). ``transformers`` is not a dependency: this module is imported,
and registers both, once ``transformers.pytorch_utils`` is (see ``_registry.load_optional_samplers``).

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

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import (
    GhostCall,
    GhostGroup,
    Grads,
    Scratch,
    group_rows,
    register_norm_sampler,
    sum_rows,
    weight_and_bias,
)
from dpnotebook.grad_sample.samplers.linear_norm import LinearGroup, linear_piece, linear_settles


@register_grad_sampler(Conv1D)
def conv1d_grad_sampler(layer: nn.Module, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of ``layer.weight`` (``[B, in, out]``) and ``layer.bias``."""
    a, g = group_rows(activations[0], K), group_rows(backprops, K)
    return weight_and_bias(
        layer, lambda: torch.einsum("bni,bno->bio", a, g) / K, lambda: sum_rows(backprops, K, keep=1)
    )


@register_norm_sampler(Conv1D, settles=linear_settles)
def conv1d_group(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``Conv1D``: a linear layer's group over the calls' positions, its weight transposed."""
    piece = linear_piece([(c.activations()[0], c.received(), c.scale) for c in calls], K)
    piece.transposed = True
    weight, bias = cast(nn.Parameter, module.weight), cast("nn.Parameter | None", getattr(module, "bias", None))
    return LinearGroup(weight, bias, {None: piece})


#: Conv1D's group: a :class:`LinearGroup` whose piece is transposed.
Conv1DGroup = LinearGroup

__all__ = ["conv1d_grad_sampler", "Conv1DGroup", "conv1d_group"]
