"""Grad sampler for :class:`~dpnotebook.layers.lora.LoRALinear`.

With ``u_t = A x_t`` (``[r]``) and ``s = alpha / r``, the layer's output at
position ``t`` is ``y_t = W x_t + b + s B u_t``. For backprops ``g_t = dL/dy_t``:

* ``dL/dB = s * sum_t g_t u_t^T`` (``[out, r]``): a linear layer's weight
  gradient, with ``u`` as its input;
* ``dL/dA = s * sum_t (B^T g_t) x_t^T`` (``[r, in]``): the backprops pulled
  back through ``B`` first;
* ``dL/dW = sum_t g_t x_t^T`` and ``dL/db = sum_t g_t``, only if the base is unfrozen.

As for ``nn.Linear``, a sample's ``K`` copies join the sum over ``t``, and
dividing by ``K`` averages them: one batched product per parameter.

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
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import group_rows, sum_rows
from dpnotebook.layers.lora import LoRALinear

__all__ = ["lora_grad_sampler"]


@register_grad_sampler(LoRALinear)
def lora_grad_sampler(
    layer: LoRALinear, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ``lora_A`` and ``lora_B`` (and of ``weight``, ``bias`` if they are trained)."""
    x = group_rows(activations[0], K)  # [B, n, in], n = K * positions
    g = group_rows(backprops, K)  # [B, n, out]
    out: dict[nn.Parameter, Tensor] = {}
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
