"""One recurrent step of each cell, the loop over time for one direction, and its fused twin.

Each step receives ``gx_t``, the input half of the gate pre-activations (precomputed for all steps
by :class:`~dpnotebook.units.GateProjection`), and adds the hidden half ``h_{t-1} W_hh^T``, in the
order of PyTorch's own CPU kernels. :func:`run_direction` is that loop in Python, the formula to
read; :func:`run_fused` computes the same with PyTorch's fused RNN operator (cuDNN on a GPU), fed
``gx`` as its input with an identity input weight, so the gradient it returns to ``gx`` is exactly
``g_t = dL/dgates_t``. :func:`choose_recurrence` decides which runs (``docs/guarantees.md``).

>>> import torch
>>> gx = torch.zeros(3, 2, 4)                      # T=3 steps, B=2, one RNN gate of size H=4
>>> states, (h,) = run_direction("RNN_TANH", gx, (torch.ones(2, 4),), torch.eye(4), None)
>>> states.shape, torch.allclose(h, torch.tanh(torch.tanh(torch.tanh(torch.ones(2, 4)))))
(torch.Size([3, 2, 4]), True)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache

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
    i, f, g, o = torch.addmm(gx, h, w_hh_t).chunk(4, 1)
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


STEPS: dict[str, Step] = {"RNN_TANH": rnn_tanh_step, "RNN_RELU": rnn_relu_step, "LSTM": lstm_step, "GRU": gru_step}


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
        mask: ``[T, B, 1]`` bool; where ``False`` the state is carried over (a packed sequence that ended).

    Returns:
        ``(states, final)``: the hidden state after each step, ``[T, B, H]`` in time order (a view of
        a batch-major tensor), and the state after the last step taken.
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


RECURRENCES = ("auto", "fused", "loop")


def choose_recurrence(setting: str, gx: Tensor, mask: Tensor | None) -> str:
    """``"fused"`` or ``"loop"``: which of :func:`run_fused` and :func:`run_direction` runs (decided here only).

    ``setting`` is the layer's ``recurrence``: ``"auto"`` fuses on a GPU with cuDNN enabled (on the
    CPU the identity weight's ``G x G`` product makes the loop faster), ``"fused"`` wherever it can,
    ``"loop"`` never. The loop runs whatever the setting for a packed batch of unequal lengths (the
    fused operator cannot freeze a sample's state) and under ``torch.func`` transforms. cuDNN's RNN
    backward cannot be differentiated again: for a double backward on a GPU use ``"loop"``.

    >>> gx = torch.zeros(3, 2, 4)
    >>> choose_recurrence("auto", gx, None), choose_recurrence("fused", gx, None)
    ('loop', 'fused')
    >>> choose_recurrence("fused", gx, torch.ones(3, 2, 1, dtype=torch.bool))
    'loop'
    """
    if setting not in RECURRENCES:
        raise ValueError(f"recurrence={setting!r} is not one of {RECURRENCES}; 'auto' (the default) picks for you.")
    if setting == "loop" or mask is not None or torch._C._are_functorch_transforms_active():
        return "loop"
    if setting == "auto" and not (gx.is_cuda and torch.backends.cudnn.enabled):
        return "loop"
    return "fused"


@lru_cache(maxsize=16)
def _constant(kind: str, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The identity input weight (``"eye"``) or the zero input bias (``"zeros"``), made once per size."""
    with torch.inference_mode(False):  # an inference tensor could not be saved for a later backward
        return (torch.eye if kind == "eye" else torch.zeros)(size, dtype=dtype, device=device)


def run_fused(
    mode: str, gx: Tensor, state: State, w_hh: Tensor, b_hh: Tensor | None, *, reverse: bool = False
) -> tuple[Tensor, State]:
    """:func:`run_direction` (without ``mask``) by PyTorch's fused RNN operator: same arguments, same results.

    For GRU the operator also gets ``b_hh``, which belongs inside the candidate gate ``r * (h W_hn^T + b_hn)``.

    >>> gx, h0, w = torch.randn(3, 2, 12), torch.randn(2, 4), torch.randn(12, 4)
    >>> fused, (h,) = run_fused("GRU", gx, (h0,), w, torch.ones(12), reverse=True)
    >>> loop, (h_loop,) = run_direction("GRU", gx, (h0,), w, torch.ones(12), reverse=True)
    >>> torch.allclose(fused, loop, atol=1e-6), torch.allclose(h, h_loop, atol=1e-6)
    (True, True)
    """
    G, dtype = gx.shape[-1], w_hh.dtype
    params = [_constant("eye", G, dtype, gx.device), w_hh]
    if b_hh is not None:  # GRU only: the other cells have b_hh in gx already
        params += [_constant("zeros", G, dtype, gx.device), b_hh]
    # Under autocast gx arrives in bf16/fp16 while W_hh stays float32: the recurrence runs in W_hh's dtype
    # (autocast off around the operator, which would otherwise cast some weights and not others).
    xs = gx.to(dtype).transpose(0, 1)  # the batch-major tensor gx is a view of: its gradient comes back batch-major
    xs = xs.flip(1) if reverse else xs
    hx = tuple(s.to(dtype).unsqueeze(0).contiguous() for s in state)  # cuDNN refuses a strided state
    op = getattr(torch._VF, mode.lower())
    # train: cuDNN keeps what its backward needs, whatever the module's mode (no dropout inside one layer)
    args = (len(params) == 4, 1, 0.0, torch.is_grad_enabled(), False, True)
    with warnings.catch_warnings(), torch.autocast(gx.device.type, enabled=False):
        # cuDNN copies the identity and W_hh into one buffer per call: cheap
        warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")
        if mode == "LSTM":
            out, h, c = op(xs, hx, params, *args)
            final: State = (h[0], c[0])
        else:
            out, h = op(xs, hx[0], params, *args)
            final = (h[0],)
    out = out.flip(1) if reverse else out
    return out.transpose(0, 1), final


__all__ = ["run_direction", "run_fused", "choose_recurrence", "RECURRENCES", "STEPS"]
