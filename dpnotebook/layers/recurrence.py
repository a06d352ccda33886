"""One recurrent step of each cell, and the loop over time for one direction.

Each step receives ``gx_t``, the input half of the gate pre-activations
(precomputed for all steps by :class:`~dpnotebook.layers.gate_projection.GateProjection`),
and adds the hidden half ``h_{t-1} W_hh^T``. The formulas and the order of the
operations follow PyTorch's own CPU kernels, so outputs agree to rounding.

>>> import torch
>>> gx = torch.zeros(3, 2, 4)                      # T=3 steps, B=2, one RNN gate of size H=4
>>> states, (h,) = run_direction("RNN_TANH", gx, (torch.ones(2, 4),), torch.eye(4), None)
>>> states.shape, torch.allclose(h, torch.tanh(torch.tanh(torch.tanh(torch.ones(2, 4)))))
(torch.Size([3, 2, 4]), True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

State = tuple[Tensor, ...]
Step = Callable[[Tensor, State, Tensor, "Tensor | None"], State]


def rnn_tanh_step(gx: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor | None) -> State:
    """``h_t = tanh(gx_t + h_{t-1} W_hh^T)`` (``b_hh`` is already in ``gx_t``)."""
    return (torch.tanh(torch.addmm(gx, state[0], w_hh_t)),)


def rnn_relu_step(gx: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor | None) -> State:
    """``h_t = relu(gx_t + h_{t-1} W_hh^T)``."""
    return (torch.relu(torch.addmm(gx, state[0], w_hh_t)),)


def lstm_step(gx: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor | None) -> State:
    """Gates ``i, f, g, o``; ``c_t = f c_{t-1} + i g``; ``h_t = o tanh(c_t)``."""
    h, c = state
    gates = torch.addmm(gx, h, w_hh_t)
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def gru_step(gx: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor | None) -> State:
    """``r, z = sigmoid(...)``; ``n = tanh(gx_n + r (h W_hn^T + b_hn))``; ``h_t = (h - n) z + n``."""
    h = state[0]
    gh = torch.mm(h, w_hh_t) if b_hh is None else torch.addmm(b_hh, h, w_hh_t)
    H = h.shape[1]
    r, z = torch.sigmoid(gx[:, : 2 * H] + gh[:, : 2 * H]).chunk(2, 1)
    n = torch.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
    return ((h - n) * z + n,)


STEPS: dict[str, Step] = {
    "RNN_TANH": rnn_tanh_step,
    "RNN_RELU": rnn_relu_step,
    "LSTM": lstm_step,
    "GRU": gru_step,
}


def run_direction(
    mode: str,
    gx: Tensor,
    state: State,
    w_hh: Tensor,
    b_hh: Tensor | None,
    *,
    reverse: bool = False,
    mask: Tensor | None = None,
) -> tuple[Tensor, State]:
    """Run one direction of one layer over all time steps.

    Args:
        mode: ``"RNN_TANH"``, ``"RNN_RELU"``, ``"LSTM"`` or ``"GRU"``.
        gx: input half of the gate pre-activations, ``[T, B, G]``.
        state: initial state, ``(h0,)`` or ``(h0, c0)`` for LSTM, each ``[B, H]``.
        w_hh: hidden-to-hidden weight ``[G, H]``.
        b_hh: hidden bias, used here by GRU only (the others fold it into ``gx``).
        reverse: run from the last time step to the first.
        mask: ``[T, B, 1]`` bool; where ``False`` the state is carried over unchanged
            (a packed sequence that has ended, see :mod:`dpnotebook.layers.packing`).

    Returns:
        ``(states, final)``: the hidden state after each step ``[T, B, H]`` in time
        order (a view of a batch-major ``[B, T, H]`` tensor, the layout of a
        ``batch_first`` output and of the next layer's input), and the state after
        the last step taken.
    """
    step = STEPS[mode]
    w_hh_t = w_hh.t()
    # One backward node for all steps (indexing gx[t] would make T). Unbinding the batch-major
    # layout makes that node stack the step gradients batch-major: [B, T, G], no copy later.
    inputs = gx.transpose(0, 1).unbind(1)
    order = range(len(inputs) - 1, -1, -1) if reverse else range(len(inputs))
    hidden: list[Tensor] = [state[0]] * len(inputs)
    for t in order:
        new = step(inputs[t], state, w_hh_t, b_hh)
        if mask is not None:
            new = tuple(torch.where(mask[t], n, s) for n, s in zip(new, state, strict=True))
        state = new
        hidden[t] = state[0]
    return torch.stack(hidden, 1).transpose(0, 1), state


__all__ = ["run_direction", "STEPS", "lstm_step", "gru_step", "rnn_tanh_step", "rnn_relu_step"]
