"""Grad sampler for :class:`~dpnotebook.units.GateProjection`, the input side of a recurrent layer.

Per sample, with ``g_t = dL/dgates_t`` (see :mod:`dpnotebook.units`)::

    dL/dW_ih = sum_t g_t^T x_t        dL/dW_hh = sum_t g'_t^T h_{t-1}
    dL/db_ih = sum_t g_t              dL/db_hh = sum_t g'_t

where ``g'_t = g_t`` except for GRU's candidate gate (``r_t * g_t``); the ``h_{t-1}`` come from
the layer's ``HiddenRecord``. A sample's ``K`` copies are summed and divided by ``K``.

>>> import torch
>>> from dpnotebook.grad_sample import GradSampleModule
>>> from dpnotebook.layers import DPLSTM
>>> lstm = DPLSTM(3, 4, batch_first=True)
>>> out, _ = GradSampleModule(lstm, K=2)(torch.randn(6, 5, 3))   # 3 samples x 2 copies, 5 steps
>>> out.sum().backward()
>>> lstm.weight_ih_l0.grad_sample.shape, lstm.bias_hh_l0.grad_sample.shape   # 4 gates x 4 hidden
(torch.Size([3, 16, 3]), torch.Size([3, 16]))
"""

from __future__ import annotations

from typing import Any

import torch
from opt_einsum import contract
from torch import Tensor

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, group_rows, sum_rows
from dpnotebook.units import GateProjection


@register_grad_sampler(GateProjection)
def gate_projection_grad_sampler(unit: GateProjection, activations: list[Any], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradients of all four parameters of one recurrent layer and direction."""
    x, record = activations[0], activations[1]
    with torch.no_grad():
        h_prev = record.hidden_inputs().to(backprops.dtype)
        g_hh = unit.hidden_backprops(x, h_prev, backprops)
    out: Grads = {}
    for weight, g, a in ((unit.weight_ih, backprops, x), (unit.weight_hh, g_hh, h_prev)):
        if weight.requires_grad:
            out[weight] = contract("bno,bni->boi", group_rows(g, K), group_rows(a, K)) / K
    for bias, g in ((unit.bias_ih, backprops), (unit.bias_hh, g_hh)):
        if bias is not None and bias.requires_grad:
            out[bias] = sum_rows(g, K, keep=1)
    return out
