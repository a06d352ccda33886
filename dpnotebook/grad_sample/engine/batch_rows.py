"""How many rows (``B*K``) a forward pass's input carries.

The wrapper compares this count with the rows every layer sees: a layer whose
batch dim holds another count is computing per-sample gradients for something
other than the samples (time steps, say), and clipping those would not bound
what each sample contributes.

>>> import torch
>>> count_rows((torch.zeros(13, 7, dtype=torch.long),), {}, batch_first=True)
13
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


def _tensors_in_order(obj: Any) -> Any:
    """Yield the tensors and PackedSequences in ``obj``, nested tuples/lists/dicts flattened in order."""
    if isinstance(obj, (Tensor, PackedSequence)):
        yield obj
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, str)):
        for key in list(obj.keys()):
            yield from _tensors_in_order(obj[key])
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors_in_order(item)


def count_rows(args: tuple, kwargs: dict, *, batch_first: bool, min_dim: int = 1) -> int | None:
    """The number of rows of the forward's input: the size of its batch dim, or ``None``.

    The first tensor (positional arguments first, then keyword arguments; nested
    tuples, lists and dicts such as a Hugging Face style batch flattened in
    order) that has the batch dim (0 if ``batch_first`` else 1) decides. Tensors
    without that dim (a 0-d flag, a 1-d tensor when ``batch_first=False``) and
    non-tensors (ints, strings, ``None``) are skipped. A ``PackedSequence``
    carries one row per sequence whatever ``batch_first``.

    Args:
        args: the forward's positional arguments.
        kwargs: the forward's keyword arguments.
        batch_first: whether the batch dim is dim 0 (``True``) or dim 1.
        min_dim: tensors with fewer dims are skipped too. ``GradSampleModule``
            passes 2: a 1-d input may be the flat indices of an ``EmbeddingBag``
            called with offsets, whose length is not the number of samples.

    Returns:
        The number of rows, or ``None`` when no input tensor has the batch dim.

    >>> import torch
    >>> from torch.nn.utils.rnn import pack_sequence
    >>> count_rows((torch.zeros(5, 4, 3),), {}, batch_first=False)
    4
    >>> count_rows((torch.tensor(True), 3), {"x": {"input_ids": torch.zeros(6, 9)}}, batch_first=True)
    6
    >>> count_rows((pack_sequence([torch.zeros(3, 2), torch.zeros(1, 2)]),), {}, batch_first=False)
    2
    >>> count_rows((torch.zeros(8),), {"flag": 1}, batch_first=False) is None
    True
    >>> count_rows((torch.zeros(8), torch.zeros(2, 3)), {}, batch_first=True, min_dim=2)
    2
    """
    bd = 0 if batch_first else 1
    for obj in (args, kwargs):
        for t in _tensors_in_order(obj):
            if isinstance(t, PackedSequence):
                if t.sorted_indices is not None:
                    return len(t.sorted_indices)
                return int(t.batch_sizes[0]) if len(t.batch_sizes) else 0
            if t.dim() > bd and t.dim() >= min_dim:
                return int(t.shape[bd])
    return None


__all__ = ["count_rows"]
