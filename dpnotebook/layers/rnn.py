"""``DPRNN``, ``DPLSTM``, ``DPGRU``: drop-in replacements for ``nn.RNN/LSTM/GRU``.

Same constructor arguments, parameter names, ``state_dict``, inputs and outputs
(``PackedSequence``, initial states, unbatched input) as the ``torch.nn`` layers,
so ``load_state_dict`` works both ways. Each layer and direction runs in two
halves: a :class:`~dpnotebook.layers.gate_projection.GateProjection` computes
the input half of the gates for all time steps at once (its grad sampler gives
the per-sample gradients of all four parameters), and
:mod:`~dpnotebook.layers.recurrence` adds the hidden half step by step.

``PackedSequence``: per-sample gradients are simpler with a fixed batch, so a
packed batch is padded (time-major, original sample order), every time step runs
for every sample, and the state of a sample whose sequence has ended is *frozen*
(``h_t = h_{t-1}`` where ``mask[t]`` is ``False``). A frozen step's output is never
used, so its gates receive a zero gradient. The reverse direction starts from
``h0`` and stays frozen until it reaches each sample's last element, exactly as
the packed computation. With all lengths equal there is nothing to freeze
(``mask`` is ``None``) and the fused recurrence may run.

>>> import torch
>>> from torch import nn
>>> lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
>>> dp = DPLSTM(3, 4, num_layers=2, batch_first=True)
>>> _ = dp.load_state_dict(lstm.state_dict())
>>> x = torch.randn(2, 5, 3)
>>> torch.allclose(dp(x)[0], lstm(x)[0], atol=1e-6)
True
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from dpnotebook.layers.gate_projection import GateProjection, HiddenRecord
from dpnotebook.layers.recurrence import choose_recurrence, run_direction, run_fused
from dpnotebook.layers.shared import reshare

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


@dataclass
class PaddedBatch:
    """A packed batch laid out as ``[T, B, F]``, samples in their original order.

    Attributes:
        x: the padded input (zeros after each sequence's end).
        mask: ``[T, B, 1]``, ``True`` where time ``t`` lies within sample ``b``'s sequence;
            ``None`` when every sequence has all ``T`` steps.
        time_index, batch_index: for each row of the packed ``data``, its place in ``x``.
    """

    x: Tensor
    mask: Tensor | None
    time_index: Tensor
    batch_index: Tensor


def pad_packed(seq: PackedSequence) -> PaddedBatch:
    """Lay a ``PackedSequence`` out as a padded time-major batch (differentiable).

    >>> from torch.nn.utils.rnn import pack_sequence
    >>> seq = pack_sequence([torch.ones(1, 2), torch.ones(3, 2)], enforce_sorted=False)
    >>> padded = pad_packed(seq)
    >>> padded.x.shape, padded.mask[:, :, 0].T.tolist()
    (torch.Size([3, 2, 2]), [[True, False, False], [True, True, True]])
    >>> torch.equal(repack(padded.x, seq, padded).data, seq.data)
    True
    >>> pad_packed(pack_sequence([torch.ones(3, 2), torch.ones(3, 2)])).mask is None
    True
    """
    data, batch_sizes = seq.data, seq.batch_sizes
    T, B = len(batch_sizes), int(batch_sizes[0])
    order = seq.sorted_indices if seq.sorted_indices is not None else torch.arange(B)
    order = order.cpu()
    time_index = torch.repeat_interleave(torch.arange(T), batch_sizes)
    starts = torch.cumsum(batch_sizes, 0) - batch_sizes
    rank = torch.arange(len(time_index)) - starts[time_index]  # rank among the samples at time t
    batch_index = order[rank]
    lengths = torch.empty(B, dtype=torch.long)
    lengths[order] = (batch_sizes.unsqueeze(1) > torch.arange(B)).sum(0)
    mask = (torch.arange(T).unsqueeze(1) < lengths).unsqueeze(-1)
    time_index, batch_index = time_index.to(data.device), batch_index.to(data.device)
    x = data.new_zeros(T, B, *data.shape[1:]).index_put((time_index, batch_index), data)
    full = bool(mask.all())  # on the CPU: batch_sizes always is
    return PaddedBatch(x, None if full else mask.to(data.device), time_index, batch_index)


def repack(out: Tensor, like: PackedSequence, padded: PaddedBatch) -> PackedSequence:
    """The rows of the time-major ``out`` that ``like`` holds, packed the same way."""
    data = out[padded.time_index, padded.batch_index]
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


class DPRNNBase(nn.Module):
    """The shared machinery of :class:`DPRNN`, :class:`DPLSTM` and :class:`DPGRU`.

    Parameters live on this module under their ``torch.nn`` names
    (``weight_ih_l0``, ``bias_hh_l1_reverse``...); ``gate_projections[l * D + d]``
    shares those of layer ``l`` and direction ``d``.
    """

    _dpn_grad_samples_from_children = True  # hooks mode: the GateProjections hold the samplers
    #: ``"auto"``, ``"fused"`` or ``"loop"``: how the recurrence runs (see
    #: :func:`~dpnotebook.layers.recurrence.choose_recurrence`); set it on a layer to override.
    recurrence: str = "auto"

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(input_size, hidden_size, num_layers, bias, batch_first, dropout)
        self.mode = mode
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0
        D, G = self.num_directions, GATES[mode] * hidden_size
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(D):
                in_size = input_size if layer == 0 else hidden_size * D
                shapes: dict[str, tuple[int, ...]] = {"weight_ih": (G, in_size), "weight_hh": (G, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(G,), bias_hh=(G,))
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                for kind, shape in shapes.items():
                    param = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
                    nn.Module.__setattr__(self, kind + suffix, param)
                self._all_weights.append([kind + suffix for kind in shapes])
                self._flat_weights_names.extend(self._all_weights[-1])
        self.gate_projections = nn.ModuleList(
            GateProjection(mode, *(getattr(self, n) for n in names)) for names in self._all_weights
        )
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """The parameters of each layer and direction, as ``nn.LSTM.all_weights``."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    @property
    def _flat_weights(self) -> list[nn.Parameter]:
        return [getattr(self, n) for n in self._flat_weights_names]

    def reset_parameters(self) -> None:
        """Uniform in ``[-1/sqrt(H), 1/sqrt(H)]``, drawn in the same order as ``torch.nn``."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """Does nothing (``nn.LSTM`` packs its weights for cuDNN here); kept for compatibility."""

    def _unit(self, k: int) -> GateProjection:
        """``gate_projections[k]``, the unit of layer ``k // D`` and direction ``k % D``."""
        return cast(GateProjection, self.gate_projections[k])  # the ModuleList holds only GateProjections

    def _links(self) -> list[tuple[GateProjection, dict[str, str]]]:
        slots = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        # strict=False: without biases a unit has only the two weights, and the bias slots stay unlinked
        return [(self._unit(k), dict(zip(slots, names, strict=False))) for k, names in enumerate(self._all_weights)]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self.__dict__.get("_flat_weights_names", ()) and "gate_projections" in self._modules:
            reshare(self, self._links())  # a parameter object was replaced

    def _apply(self, fn: Any, recurse: bool = True) -> DPRNNBase:
        out = super()._apply(fn, recurse)
        reshare(self, self._links())
        return out

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s

    # -- the forward pass ------------------------------------------------------
    def forward(self, input: Tensor | PackedSequence, hx: Any = None) -> tuple[Any, Any]:
        """Same inputs and outputs as the ``torch.nn`` layer.

        Args:
            input: ``[B, T, input_size]`` (``batch_first``), ``[T, B, input_size]``,
                unbatched ``[T, input_size]``, or a ``PackedSequence``.
            hx: initial state ``h0`` (``(h0, c0)`` for LSTM), each
                ``[num_layers * num_directions, B, hidden_size]``; zeros if ``None``.

        Returns:
            ``(output, h_n)`` (``(output, (h_n, c_n))`` for LSTM), shaped as in ``torch.nn``.
        """
        padded: PaddedBatch | None = None
        if isinstance(input, PackedSequence):
            padded = pad_packed(input)
            x = padded.x
        else:
            x = input
        packed = padded is not None
        batched = packed or x.dim() == 3
        if not packed:
            if x.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {x.dim()}D tensor instead")
            x = x.transpose(0, 1) if (self.batch_first and batched) else x
            x = x if batched else x.unsqueeze(1)
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got {x.shape[-1]}"
            )
        state = self._initial_state(x, hx, batched)
        output, finals = self._layers(x, state, None if padded is None else padded.mask)
        if padded is not None:
            return repack(output, cast(PackedSequence, input), padded), self._pack_state(finals)  # input was packed
        if not batched:
            output, finals = output.squeeze(1), [f.squeeze(1) for f in finals]
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, self._pack_state(finals)

    def _initial_state(self, x: Tensor, hx: Any, batched: bool) -> list[Tensor]:
        """``[h0]`` or ``[h0, c0]``, each ``[L * D, B, H]`` (zeros where not given)."""
        n = 2 if self.mode == "LSTM" else 1
        shape = (self.num_layers * self.num_directions, x.shape[1], self.hidden_size)
        if hx is None:
            return [torch.zeros(shape, dtype=x.dtype, device=x.device)] * n
        states = list(hx) if n == 2 else [hx]
        if len(states) != n or not all(isinstance(s, Tensor) for s in states):
            raise TypeError(f"{type(self).__name__} expects hx = {'(h0, c0)' if n == 2 else 'h0'}.")
        states = [s if batched else s.unsqueeze(1) for s in states]
        for s in states:
            if tuple(s.shape) != shape:
                raise RuntimeError(f"Expected hidden size {shape}, got {list(s.shape)}")
        return states

    def _pack_state(self, finals: list[Tensor]) -> Any:
        return (finals[0], finals[1]) if self.mode == "LSTM" else finals[0]

    def _layers(self, x: Tensor, state: list[Tensor], mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """Run all layers on the time-major ``x``; returns the last layer's output and final states."""
        D = self.num_directions
        finals: list[list[Tensor]] = [[] for _ in state]
        for layer in range(self.num_layers):
            outputs = []
            for d in range(D):
                k = layer * D + d
                unit = self._unit(k)
                record = HiddenRecord(reverse=d == 1)
                gx = unit(x.transpose(0, 1).contiguous(), record).transpose(0, 1)  # [T, B, G] view of [B, T, G]
                start = tuple(s[k] for s in state)
                b_hh = unit.bias_hh if self.mode == "GRU" else None
                if choose_recurrence(self.recurrence, gx, mask) == "fused":
                    states, final = run_fused(self.mode, gx, start, unit.weight_hh, b_hh, reverse=d == 1)
                else:
                    states, final = run_direction(self.mode, gx, start, unit.weight_hh, b_hh, reverse=d == 1, mask=mask)
                record.h0, record.states = start[0].detach(), states.detach().transpose(0, 1)  # [B, T, H]
                outputs.append(states)
                for kept, f in zip(finals, final, strict=True):
                    kept.append(f)
            x = outputs[0] if D == 1 else torch.cat(outputs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, [torch.stack(f) for f in finals]


def _check_arguments(
    input_size: int, hidden_size: int, num_layers: int, bias: bool, batch_first: bool, dropout: float
) -> None:
    """The argument checks of ``torch.nn.RNNBase``, with its messages."""
    if not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
        raise ValueError(
            "dropout should be a number in range [0, 1] representing the probability of an element being zeroed"
        )
    for name, value in (("bias", bias), ("batch_first", batch_first)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} should be of type bool, got: {type(value).__name__}")
    for name, size in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"{name} should be of type int, got: {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"{name} must be greater than zero")
    if dropout > 0 and num_layers == 1:
        warnings.warn(
            "dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
            f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
            stacklevel=3,
        )


class DPRNN(DPRNNBase):
    """Drop-in ``nn.RNN`` (Elman RNN, ``tanh`` or ``relu``) with hooks-mode per-sample gradients.

    >>> import torch
    >>> rnn = DPRNN(3, 4, nonlinearity="relu", bidirectional=True)
    >>> out, h = rnn(torch.randn(5, 2, 3))
    >>> out.shape, h.shape
    (torch.Size([5, 2, 8]), torch.Size([2, 2, 4]))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


class DPLSTM(DPRNNBase):
    """Drop-in ``nn.LSTM`` with hooks-mode per-sample gradients (``proj_size`` is not supported).

    >>> import torch
    >>> lstm = DPLSTM(3, 4, batch_first=True)
    >>> out, (h, c) = lstm(torch.randn(2, 5, 3))
    >>> out.shape, h.shape, [n for n, _ in lstm.named_parameters()]
    (torch.Size([2, 5, 4]), torch.Size([1, 2, 4]), ['weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0'])
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if proj_size != 0:
            raise NotImplementedError(
                f"DPLSTM does not support proj_size={proj_size}; use proj_size=0 (the default), or "
                "follow the LSTM with an nn.Linear to project its outputs."
            )
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


class DPGRU(DPRNNBase):
    """Drop-in ``nn.GRU`` with hooks-mode per-sample gradients.

    >>> import torch
    >>> gru = DPGRU(3, 4, num_layers=2)
    >>> out, h = gru(torch.randn(5, 2, 3), torch.zeros(2, 2, 4))
    >>> out.shape, h.shape
    (torch.Size([5, 2, 4]), torch.Size([2, 2, 4]))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


__all__ = ["DPRNNBase", "DPRNN", "DPLSTM", "DPGRU", "GATES", "PaddedBatch", "pad_packed", "repack"]
