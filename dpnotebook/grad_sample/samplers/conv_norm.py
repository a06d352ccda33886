"""Convolutions in ghost mode: per-sample weight gradients, then their norms and weighted sum.

A convolution's weight is small next to its activations, so ghost mode forms
the per-sample weight gradients (``[B, *weight.shape]``) through the fast seam
:func:`~dpnotebook.grad_sample.samplers.conv.conv_per_sample_grads`, call by call as
the backprops arrive, and takes their norms and, later, their weighted sum.

>>> import torch
>>> from torch import nn
>>> from dpnotebook.grad_sample.ghost.registry import ghost_handler
>>> ghost_handler(nn.Conv2d(1, 2, 3)).make_group is conv_group
True
"""

from __future__ import annotations

from functools import partial
from typing import cast

from torch import nn

from dpnotebook.grad_sample.ghost.groups import GhostCall, GhostGroup, Grads, MaterialisedGroup, Scratch
from dpnotebook.grad_sample.ghost.registry import register_norm_sampler
from dpnotebook.grad_sample.samplers.conv import CHUNK_BYTES, MIN_CHUNK_BYTES, conv_method, conv_per_sample_grads


class ConvGroup(MaterialisedGroup):
    """A convolution's per-sample weight gradients, formed chunk by chunk in a reused buffer."""

    how = "materialised (conv)"


@register_norm_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d, materialises=True)
def conv_group(
    layer: nn.modules.conv._ConvNd, calls: list[GhostCall], K: int, scratch: Scratch | None = None
) -> GhostGroup:
    """``nn.Conv1d/2d/3d``: :func:`conv_per_sample_grads`, summed over calls."""
    grads: Grads = {}
    # torch's stubs type a convolution's weight and bias as Tensors; they are the layer's Parameters
    weight, bias = cast(nn.Parameter, layer.weight), cast("nn.Parameter | None", layer.bias)
    for i, c in enumerate(calls):  # the calls of one forward pass: same rows, same scale
        x, g = c.activations()[0], c.received()
        B = x.shape[0] // K
        if weight.requires_grad:
            shape = (B, *weight.shape)
            buf = scratch(("weight", i), shape, g) if scratch is not None else g.new_empty(shape)
            workspace = partial(scratch, ("patches", i), like=x) if scratch is not None else None
            w = conv_per_sample_grads(layer, x, g, K, buf, workspace=workspace)
            grads[weight] = w if i == 0 else grads[weight].add_(w)
        if bias is not None and bias.requires_grad:
            b = g.flatten(2).sum(2)
            b = b if K == 1 else b.reshape(B, K, -1).sum(1)
            grads[bias] = b if i == 0 else grads[bias] + b
    return ConvGroup(grads, calls[0].scale)


__all__ = ["conv_per_sample_grads", "conv_method", "conv_group", "ConvGroup", "CHUNK_BYTES", "MIN_CHUNK_BYTES"]
