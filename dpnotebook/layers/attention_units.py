"""The units that give :class:`~dpnotebook.layers.DPMultiheadAttention` per-sample gradients.

``nn.MultiheadAttention`` keeps its query/key/value projection in one packed
``in_proj_weight`` ``[3E, E]`` (or three ``*_proj_weight`` when key and value
sizes differ) and one ``in_proj_bias`` ``[3E]``, used through slices. Each unit
here shares those parameters (see :mod:`dpnotebook.layers.shared`) and is
called on a batch-first tensor, so hooks mode can give it a sampler:

* :class:`InProjection` -- ``x @ weight[rows].T + bias[rows]``; its sampler is
  the ``nn.Linear`` one, written into the rows the call used (zeros elsewhere).
  Self-attention projects q, k and v in one call, so nothing is zero-padded.
* :class:`AppendBias` -- appends ``bias_k`` (or ``bias_v``) to the keys as one
  more sequence position; its per-sample gradient is the backprop there.
* :class:`OutProjection` -- ``nn.Linear`` itself, told that its batch is in dim 0.

Attention dropout lives in the parent's forward, outside every unit: hooks
mode never replays a forward, so dropout does no harm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from opt_einsum import contract
from torch import Tensor, nn

from dpnotebook.grad_sample.samplers.sample_rows import group_rows, sum_rows
from dpnotebook.grad_sample.engine.registry import register_grad_sampler
from dpnotebook.layers.shared import SharedParameters


class InProjection(SharedParameters):
    """``x @ weight[w0:w1].T + bias[b0:b1]`` with the parent's weight and (optional) bias.

    >>> import torch
    >>> from torch import nn
    >>> w, b = nn.Parameter(torch.ones(6, 2)), nn.Parameter(torch.arange(6.0))
    >>> InProjection(w, b)(torch.ones(1, 1, 2), (2, 4), (2, 4))
    tensor([[[4., 5.]]], grad_fn=<ViewBackward0>)
    """

    _dpn_batch_first = True
    # the slots registered by SharedParameters.__init__ (declared for the type checker)
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__(weight=weight, bias=bias)

    def forward(self, x: Tensor, weight_rows: tuple[int, int], bias_rows: tuple[int, int]) -> Tensor:
        """Project ``x`` ``[N, L, in]`` with the given rows of the weight and the bias."""
        bias = None if self.bias is None else self.bias[bias_rows[0] : bias_rows[1]]
        return F.linear(x, self.weight[weight_rows[0] : weight_rows[1]], bias)


def _into_rows(full_shape: torch.Size, rows: tuple[int, int], g: Tensor) -> Tensor:
    """``g`` ``[B, r, ...]`` placed at ``rows`` of a zero ``[B, *full_shape]`` (no copy when it is all)."""
    if rows == (0, full_shape[0]):
        return g
    out = g.new_zeros(g.shape[0], *full_shape)
    out[:, rows[0] : rows[1]] = g
    return out


@register_grad_sampler(InProjection)
def in_projection_grad_sampler(
    unit: InProjection, activations: list, backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of the rows of ``weight`` and ``bias`` that this call used."""
    x, weight_rows, bias_rows = activations
    out: dict[nn.Parameter, Tensor] = {}
    if unit.weight.requires_grad:
        g = contract("bno,bni->boi", group_rows(backprops, K), group_rows(x, K)) / K
        out[unit.weight] = _into_rows(unit.weight.shape, weight_rows, g)
    if unit.bias is not None and unit.bias.requires_grad:
        out[unit.bias] = _into_rows(unit.bias.shape, bias_rows, sum_rows(backprops, K, keep=1))
    return out


class AppendBias(SharedParameters):
    """Append the parent's ``bias_k``/``bias_v`` (``[1, 1, E]``) to every sequence: ``[N, S, E] -> [N, S+1, E]``.

    >>> import torch
    >>> from torch import nn
    >>> AppendBias(nn.Parameter(torch.ones(1, 1, 2)))(torch.zeros(3, 4, 2)).shape
    torch.Size([3, 5, 2])
    """

    _dpn_batch_first = True
    bias: nn.Parameter  # the slot registered by SharedParameters.__init__ (declared for the type checker)

    def __init__(self, bias: nn.Parameter) -> None:
        super().__init__(bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.bias.expand(x.shape[0], 1, x.shape[2])], 1)


@register_grad_sampler(AppendBias)
def append_bias_grad_sampler(
    unit: AppendBias, activations: list, backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """The backprop at the appended position, averaged over each sample's K rows."""
    if not unit.bias.requires_grad:
        return {}
    last = sum_rows(backprops[:, -1], K, keep=1)  # [B, E]
    return {unit.bias: last.reshape(last.shape[0], *unit.bias.shape)}


class OutProjection(nn.modules.linear.NonDynamicallyQuantizableLinear):
    """The output ``nn.Linear`` of attention, always called on batch-first ``[N, L, E]``.

    It inherits the ``nn.Linear`` grad sampler (it does not override ``forward``).
    """

    _dpn_batch_first = True


__all__ = ["InProjection", "AppendBias", "OutProjection"]
