"""The units that give :class:`~dpnotebook.layers.DPMultiheadAttention` per-sample gradients.

``nn.MultiheadAttention`` keeps its query/key/value projection in one packed
``in_proj_weight`` ``[3E, E]`` (or three ``*_proj_weight`` when key and value
sizes differ) and one ``in_proj_bias`` ``[3E]``, used through slices. Each unit
here shares those parameters (see :mod:`dpnotebook.layers.shared`) and is
called on a batch-first tensor, so hooks mode can give it a sampler (those are
in :mod:`dpnotebook.grad_sample.samplers.attention`):

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
from torch import Tensor, nn

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


class OutProjection(nn.modules.linear.NonDynamicallyQuantizableLinear):
    """The output ``nn.Linear`` of attention, always called on batch-first ``[N, L, E]``.

    It inherits the ``nn.Linear`` grad sampler (it does not override ``forward``).
    """

    _dpn_batch_first = True


__all__ = ["InProjection", "AppendBias", "OutProjection"]
