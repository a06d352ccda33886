"""Norm layers in ghost mode: materialised with their registered grad samplers.

Their per-sample gradients (one entry per channel) are small next to their
activations, so ghost mode forms them call by call with the layer's grad sampler
(:func:`~dpnotebook.grad_sample.ghost.groups.materialise`) and lets go of the
call's inputs and backprops at once.

>>> from torch import nn
>>> from dpnotebook.grad_sample.ghost.registry import ghost_handler
>>> ghost_handler(nn.LayerNorm(4)).materialises
True
"""

from __future__ import annotations

from torch import nn

from dpnotebook.grad_sample.ghost.groups import materialise
from dpnotebook.grad_sample.ghost.registry import register_norm_sampler
from dpnotebook.layers.attention_units import AppendBias

register_norm_sampler(nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, AppendBias, materialises=True)(materialise)

__all__: list[str] = []
