"""The unit that gives a recurrent layer its per-sample gradients in hooks mode.

One step of every recurrent cell (RNN, LSTM, GRU) starts with *gate
pre-activations*, a sum of what comes from the input and from the previous
hidden state::

    gates_t = x_t W_ih^T + b_ih  +  h_{t-1} W_hh^T + b_hh

so for one sample, with ``g_t = dL/dgates_t``::

    dL/dW_ih = sum_t g_t^T x_t        dL/dW_hh = sum_t g_t^T h_{t-1}
    dL/db_ih = dL/db_hh = sum_t g_t

:class:`GateProjection` computes the input half for **all** time steps in one
matrix product before the recurrent loop starts (also the fast way to run an
RNN). Its output's gradient is then exactly ``g_t`` for every ``t``, and
autograd delivers it once backpropagation through time is over: one call of
the sampler computes every per-sample gradient with two batched contractions
(:mod:`dpnotebook.grad_sample.samplers.gate_projection`).
The ``h_{t-1}`` it needs are produced *after* the projection, by the loop; the
layer writes them into the :class:`HiddenRecord` it handed to the projection.

GRU is the one twist: its candidate gate uses ``r_t * (h_{t-1} W_hn^T + b_hn)``,
so the hidden side of that gate receives ``r_t * g_t``; the sampler recomputes
``r_t`` from ``x_t`` and ``h_{t-1}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.layers.shared import SharedParameters


@dataclass
class HiddenRecord:
    """The hidden states one direction of one layer went through (filled by the layer).

    Attributes:
        reverse: the direction ran from the last time step to the first.
        h0: initial hidden state, ``[B, H]``.
        states: hidden state after each time step, ``[B, T, H]``, in time order.
    """

    reverse: bool
    h0: Tensor | None = None
    states: Tensor | None = None

    def hidden_inputs(self) -> Tensor:
        """``h_{t-1}``: the hidden state that entered the step at each time ``t``, ``[B, T, H]``.

        >>> import torch
        >>> rec = HiddenRecord(False, h0=torch.zeros(1, 1), states=torch.tensor([[[1.], [2.]]]))
        >>> rec.hidden_inputs().flatten().tolist()
        [0.0, 1.0]
        >>> HiddenRecord(True, rec.h0, rec.states).hidden_inputs().flatten().tolist()
        [2.0, 0.0]
        """
        if self.h0 is None or self.states is None:
            raise GradSampleError(
                "a GateProjection was called outside its recurrent layer, so the hidden states "
                "its per-sample gradients need were never recorded. Call the DP layer itself."
            )
        first = self.h0.unsqueeze(1)
        if self.reverse:
            return torch.cat([self.states[:, 1:], first], 1)
        return torch.cat([first, self.states[:, :-1]], 1)


class GateProjection(SharedParameters):
    """``x_t W_ih^T + b_ih (+ b_hh)`` for all time steps of one layer and direction.

    Holds (shares) all four parameters of that layer and direction, so that its
    grad sampler can return the per-sample gradients of each.

    Args:
        mode: ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``.
        weight_ih, weight_hh, bias_ih, bias_hh: the parent's parameters (biases may be ``None``).
    """

    _dpn_batch_first = True  # inputs [B, T, I] and outputs [B, T, G], whatever the wrapper says
    # the slots registered by SharedParameters.__init__ (declared for the type checker)
    weight_ih: nn.Parameter
    weight_hh: nn.Parameter
    bias_ih: nn.Parameter | None
    bias_hh: nn.Parameter | None

    def __init__(
        self,
        mode: str,
        weight_ih: nn.Parameter,
        weight_hh: nn.Parameter,
        bias_ih: nn.Parameter | None = None,
        bias_hh: nn.Parameter | None = None,
    ) -> None:
        super().__init__(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh)
        self.mode = mode

    def input_bias(self) -> Tensor | None:
        """The bias added before the loop: ``b_ih + b_hh``, or ``b_ih`` alone for GRU."""
        if self.bias_ih is None or self.mode == "GRU":
            return self.bias_ih
        assert self.bias_hh is not None  # the parent creates both biases or neither
        return self.bias_ih + self.bias_hh

    def forward(self, x: Tensor, record: HiddenRecord) -> Tensor:
        """``[B, T, I] -> [B, T, G]``: one matrix product over all ``B*T`` positions.

        The result is batch-major (the loop reads it time step by time step through
        a transposed view), so the gradient that comes back is batch-major too and
        a sample's positions sit side by side: the grad sampler and ghost mode use
        it as ``[B, K*T, G]`` without copying it.
        """
        return F.linear(x, self.weight_ih, self.input_bias())

    def hidden_backprops(self, x: Tensor, h_prev: Tensor, g: Tensor) -> Tensor:
        """``dL/d(h_{t-1} W_hh^T + b_hh)`` from ``g = dL/dgates`` (they differ only for GRU)."""
        if self.mode != "GRU":
            return g
        H = h_prev.shape[-1]
        w_r, b_ih, b_hh = self.weight_hh[:H], self.bias_ih, self.bias_hh
        pre_r = F.linear(x, self.weight_ih[:H], None if b_ih is None else b_ih[:H])
        pre_r = pre_r + F.linear(h_prev, w_r, None if b_hh is None else b_hh[:H])
        return torch.cat([g[..., : 2 * H], torch.sigmoid(pre_r) * g[..., 2 * H :]], -1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, shares={list(self.slot_names)}"


__all__ = ["GateProjection", "HiddenRecord"]
