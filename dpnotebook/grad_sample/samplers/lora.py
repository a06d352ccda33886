"""Grad sampler for :class:`~dpnotebook.layers.lora.LoRALinear`: ``y_t = W x_t + b + s B (A x_t)``, ``s = alpha / r``.

For backprops ``g_t``: ``dL/dB = s sum_t g_t (A x_t)^T``, ``dL/dA = s sum_t (B^T g_t) x_t^T``, and
``dL/dW``, ``dL/db`` as a linear layer's if the base is unfrozen; a sample's ``K`` copies join the
sum over ``t``, divided by ``K``.

>>> import torch
>>> from dpnotebook.layers.lora import LoRALinear
>>> from dpnotebook.testing import check_grad_sampler
>>> layer = LoRALinear(3, 2, rank=2, generator=torch.Generator().manual_seed(0))
>>> _ = torch.nn.init.normal_(layer.lora_B)
>>> check_grad_sampler(layer, torch.randn(6, 3), K=3).ok
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, group_rows, sum_rows
from dpnotebook.units import LoRALinear

__all__ = ["lora_grad_sampler"]


@register_grad_sampler(LoRALinear)
def lora_grad_sampler(layer: LoRALinear, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of ``lora_A`` and ``lora_B`` (and of ``weight``, ``bias`` if they are trained)."""
    x = group_rows(activations[0], K)  # [B, n, in], n = K * positions
    g = group_rows(backprops, K)  # [B, n, out]
    out: Grads = {}
    factor = layer.scale / K
    if layer.lora_B.requires_grad:
        u = torch.matmul(x, layer.lora_A.t())  # [B, n, r]
        out[layer.lora_B] = torch.bmm(g.transpose(1, 2), u) * factor
    if layer.lora_A.requires_grad:
        h = torch.matmul(g, layer.lora_B)  # [B, n, r]: B^T g_t
        out[layer.lora_A] = torch.bmm(h.transpose(1, 2), x) * factor
    if layer.weight.requires_grad:
        out[layer.weight] = torch.bmm(g.transpose(1, 2), x) / K
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = sum_rows(backprops, K, keep=1)
    return out
