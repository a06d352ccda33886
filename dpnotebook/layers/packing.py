"""``PackedSequence`` in and out of the DP recurrent layers.

``torch.nn.LSTM`` runs a packed batch with fewer rows at each later time step.
Per-sample gradients are simpler with a fixed batch, so the DP layers pad the
packed batch (time-major, original sample order), run every time step for
every sample, and *freeze* the state of a sample whose sequence has ended:
``h_t = h_{t-1}`` where ``mask[t]`` is ``False``. A frozen step's output is
never used, so its gates receive a zero gradient and add nothing to any
per-sample gradient. The reverse direction starts from ``h0`` and stays frozen
until it reaches each sample's last element, exactly as the packed computation.
When all sequences have the same length there is nothing to freeze: ``mask`` is
``None`` and the layer may run its fused recurrence.

>>> import torch
>>> from torch.nn.utils.rnn import pack_sequence
>>> seq = pack_sequence([torch.ones(1, 2), torch.ones(3, 2)], enforce_sorted=False)
>>> padded = pad_packed(seq)
>>> padded.x.shape, padded.mask[:, :, 0].T.tolist()
(torch.Size([3, 2, 2]), [[True, False, False], [True, True, True]])
>>> pad_packed(pack_sequence([torch.ones(3, 2), torch.ones(3, 2)])).mask is None
True
>>> torch.equal(repack(padded.x, seq, padded).data, seq.data)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


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
    """Lay a ``PackedSequence`` out as a padded time-major batch (differentiable)."""
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


__all__ = ["PaddedBatch", "pad_packed", "repack"]
