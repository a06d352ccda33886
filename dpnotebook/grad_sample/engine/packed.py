"""Refusing a ``PackedSequence`` where per-sample gradients cannot split it.

A ``PackedSequence`` interleaves its sequences time step by time step: its
``data`` has one row per *time step* of the batch (``sum(lengths)`` rows), so
no dim of it holds one row per sample. ``torch.func``'s replay (functorch
mode, and the hooks-mode fallback) and ExpandedWeights split tensors by rows,
and would silently clip per time step. The DP recurrent layers
(:class:`dpnotebook.DPLSTM` ...) unpack it themselves, in hooks mode.

>>> import torch
>>> from torch import Tensor, nn
>>> from torch.nn.utils.rnn import pack_padded_sequence
>>> packed = pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
>>> refuse_packed((packed,), {}, "functorch", nn.LSTM(4, 5))
Traceback (most recent call last):
...
dpnotebook.errors.GradSampleError: grad_sample_mode='functorch': LSTM received a PackedSequence (batch_sizes=[2, 2, 1]): ...
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten

from dpnotebook.errors import GradSampleError

__all__ = ["refuse_packed"]


def refuse_packed(args: tuple, kwargs: dict, mode: str, model: nn.Module) -> None:
    """Raise if a ``PackedSequence`` is among ``model``'s arguments: ``mode`` cannot split one per sample."""
    if not kwargs and all(isinstance(a, Tensor) for a in args):  # the usual call, checked cheaply
        return
    leaves, _ = tree_flatten((args, kwargs), is_leaf=lambda x: isinstance(x, PackedSequence))
    packed = next((x for x in leaves if isinstance(x, PackedSequence)), None)
    if packed is not None:
        raise GradSampleError(
            f"grad_sample_mode={mode!r}: {type(model).__name__} received a PackedSequence (batch_sizes="
            f"{packed.batch_sizes.tolist()}): its data {tuple(packed.data.shape)} interleaves the sequences "
            f"time step by time step, so its rows are time steps, not samples, and {mode} mode cannot split it "
            "per sample. Fix: use grad_sample_mode='hooks' with dpnotebook.DPLSTM / DPGRU / DPRNN, which handle "
            "PackedSequence (dpnotebook.fix(model) swaps them in), or pass a padded tensor (pad_packed_sequence)."
        )
