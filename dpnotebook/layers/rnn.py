"""``DPRNN``, ``DPLSTM``, ``DPGRU``: drop-in replacements for ``nn.RNN/LSTM/GRU``.

Same constructor arguments, parameter names, ``state_dict``, inputs and outputs as the ``torch.nn``
layers. Each layer and direction runs in two halves: a :class:`~dpnotebook.units.GateProjection`
computes the input half of the gates for all time steps at once (its grad sampler gives the four
parameters' per-sample gradients), and :mod:`~dpnotebook.layers.recurrence` adds the hidden half.
A ``PackedSequence`` is padded and every step runs for every sample; a sample whose sequence has
ended keeps its state (``h_t = h_{t-1}``), so its gates receive a zero gradient, as when packed.

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

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from dpnotebook.layers.recurrence import choose_recurrence, run_direction, run_fused
from dpnotebook.units import GateProjection, HiddenRecord, UnitOwner


@dataclass
class PaddedBatch:
    """A packed batch laid out as ``[T, B, F]``, samples in their original order.

    Attributes:
        x: the padded input (zeros after each sequence's end).
        mask: ``[T, B, 1]``, ``True`` where time ``t`` lies within sample ``b``'s sequence;
            ``None`` when every sequence has all ``T`` steps (then the fused recurrence may run).
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
    cpu = torch.device("cpu")  # the indices are built beside batch_sizes, whatever torch's default device is
    order = (seq.sorted_indices if seq.sorted_indices is not None else torch.arange(B, device=cpu)).cpu()
    time_index = torch.repeat_interleave(torch.arange(T, device=cpu), batch_sizes)
    starts = torch.cumsum(batch_sizes, 0) - batch_sizes
    batch_index = order[torch.arange(len(time_index), device=cpu) - starts[time_index]]  # rank among those at t
    lengths = torch.empty(B, dtype=torch.long, device=cpu)
    lengths[order] = (batch_sizes.unsqueeze(1) > torch.arange(B, device=cpu)).sum(0)
    mask = (torch.arange(T, device=cpu).unsqueeze(1) < lengths).unsqueeze(-1)
    time_index, batch_index = time_index.to(data.device), batch_index.to(data.device)
    x = data.new_zeros(T, B, *data.shape[1:]).index_put((time_index, batch_index), data)
    return PaddedBatch(x, None if bool(mask.all()) else mask.to(data.device), time_index, batch_index)


def repack(out: Tensor, like: PackedSequence, padded: PaddedBatch) -> PackedSequence:
    """The rows of the time-major ``out`` that ``like`` holds, packed the same way."""
    data = out[padded.time_index, padded.batch_index]
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


class DPRNNBase(UnitOwner):
    """The shared machinery of :class:`DPRNN`, :class:`DPLSTM` and :class:`DPGRU`.

    Parameters live here under their ``torch.nn`` names; ``gate_projections[l * D + d]`` shares those
    of layer ``l`` and direction ``d``.
    """

    #: ``"auto"``, ``"fused"`` or ``"loop"``: how the recurrence runs (see
    #: :func:`~dpnotebook.layers.recurrence.choose_recurrence`); set it on a layer to override.
    recurrence: str = "auto"
    all_weights = nn.RNNBase.all_weights  # the parameters of each layer and direction
    reset_parameters = nn.RNNBase.reset_parameters  # uniform in [-1/sqrt(H), 1/sqrt(H)], in torch's order

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
        for name, size in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(size, int) or isinstance(size, bool):
                raise TypeError(f"{name} should be of type int, got: {type(size).__name__}")
        # torch's own argument checks (with its messages) and parameter names, on the meta device (no memory)
        ref = nn.RNNBase(
            mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device="meta"
        )
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, ref.dropout, bidirectional
        self.proj_size = 0
        self._flat_weights_names: list[str] = ref._flat_weights_names
        self._all_weights: list[list[str]] = ref._all_weights
        for name in self._flat_weights_names:
            setattr(self, name, nn.Parameter(torch.empty(getattr(ref, name).shape, device=device, dtype=dtype)))
        units = [GateProjection(mode, *(getattr(self, n) for n in names)) for names in self._all_weights]
        self.gate_projections = nn.ModuleList(units)
        slots = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # without biases: the two weights
        self._unit_links = [
            (u, dict(zip(slots, n, strict=False))) for u, n in zip(units, self._all_weights, strict=True)
        ]
        self.reset_parameters()  # type: ignore[misc]  # torch's, reading only what this class has

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def flatten_parameters(self) -> None:
        """Does nothing (``nn.LSTM`` packs its weights for cuDNN here); kept for compatibility."""

    def extra_repr(self) -> str:
        s = nn.RNNBase.extra_repr(self)  # type: ignore[arg-type]  # formats what this class has
        return s + f", nonlinearity={self.nonlinearity!r}" if getattr(self, "nonlinearity", "tanh") != "tanh" else s

    # -- the forward pass ------------------------------------------------------
    def forward(self, input: Tensor | PackedSequence, hx: Any = None) -> tuple[Any, Any]:
        """Same inputs (``[T, B, F]``, ``batch_first``, unbatched, ``PackedSequence``, ``hx``) and outputs as torch."""
        padded = pad_packed(input) if isinstance(input, PackedSequence) else None
        x = cast(Tensor, input) if padded is None else padded.x
        batched = padded is not None or x.dim() == 3
        if padded is None:
            if x.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {x.dim()}D tensor instead")
            x = (x.transpose(0, 1) if self.batch_first else x) if batched else x.unsqueeze(1)
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got {x.shape[-1]}"
            )
        state = self._initial_state(x, hx, batched)
        output, finals = self._layers(x, state, None if padded is None else padded.mask)
        if padded is not None:
            return repack(output, cast(PackedSequence, input), padded), self._pack_state(finals)
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
                unit = cast(GateProjection, self.gate_projections[k])
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


__all__ = ["DPRNNBase", "DPRNN", "DPLSTM", "DPGRU", "PaddedBatch", "pad_packed", "repack"]
