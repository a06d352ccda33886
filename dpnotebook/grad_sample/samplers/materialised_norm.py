"""Ghost mode's materialised layers: convolutions and norm layers, whose per-sample gradients are small.

Their per-sample gradients are formed call by call as the backprops arrive (the call's inputs
let go), then their norms and weighted sum taken (a ``MaterialisedGroup``): a convolution's by
:func:`~dpnotebook.grad_sample.samplers.conv.conv_per_sample_grads` in reused buffers, a norm
layer's by its registered grad sampler (:func:`dpnotebook.grad_sample.materialise`).

>>> from torch import nn
>>> from dpnotebook.grad_sample.samplers._contracts import ghost_handler
>>> ghost_handler(nn.Conv2d(1, 2, 3)).make_group is conv_group, ghost_handler(nn.LayerNorm(4)).materialises
(True, True)
"""

from __future__ import annotations

from functools import partial
from typing import cast

from torch import nn

from dpnotebook.grad_sample.samplers._contracts import (
    GhostCall,
    GhostGroup,
    Grads,
    MaterialisedGroup,
    Scratch,
    materialise,
    register_norm_sampler,
)
from dpnotebook.grad_sample.samplers.conv import conv_per_sample_grads
from dpnotebook.units import AppendBias

__all__: list[str] = []  # the group makers are found through the registry

register_norm_sampler(nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, AppendBias, materialises=True)(materialise)


@register_norm_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d, materialises=True)
def conv_group(
    layer: nn.modules.conv._ConvNd, calls: list[GhostCall], K: int, scratch: Scratch | None = None
) -> GhostGroup:
    """``nn.Conv1d/2d/3d``: :func:`conv_per_sample_grads` in the caller's reused buffers, summed over calls."""
    grads: Grads = {}
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
    group = MaterialisedGroup(grads, calls[0].scale)
    group.how = "materialised (conv)"
    return group
