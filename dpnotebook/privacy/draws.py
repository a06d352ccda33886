"""Draw marks: which Poisson batch a tensor came from.

A :class:`~dpnotebook.privacy.data_loader.DPDataLoader` sets a :class:`Draw` on every
tensor of each batch it hands out (:func:`mark_batch`); :func:`draws_in` reads the
marks back from a model's inputs, including slices of a batch (their ``._base``
carries it). A copy of a batch (moved to another device, transformed) carries no
mark. :mod:`~dpnotebook.privacy.sampled_batches` uses them to tell, by provenance
rather than by counting, which batch the samples of an optimizer step came from.

>>> import torch
>>> x = torch.zeros(4, 2)
>>> mark_batch((x, [x]), Draw(0, 1))
>>> draws_in({"inputs": x[1:]})
{Draw(loader=0, number=1)}
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, NamedTuple

from torch import Tensor

__all__ = ["Draw", "DrawMarker", "DRAW_ATTRIBUTE", "mark_batch", "draws_in"]


class Draw(NamedTuple):
    """Which batch a tensor came from: the ``number``-th batch handed out by the loader ``loader``."""

    loader: int
    number: int


#: the attribute a DPDataLoader sets on every tensor of a batch it hands out
DRAW_ATTRIBUTE = "_dpnotebook_draw"
_loader_ids = itertools.count()


class DrawMarker:
    """Numbers the batches one loader hands out, and marks their tensors with their :class:`Draw`.

    Attributes:
        loader: a number no other loader of this process has.
        last: the :class:`Draw` of the last batch marked (``None`` before the first).
    """

    def __init__(self) -> None:
        self.loader = next(_loader_ids)
        self.last: Draw | None = None

    def mark(self, batch: Any) -> Draw:
        """Mark ``batch`` as the next batch of this loader; return its draw."""
        self.last = Draw(self.loader, self.last.number + 1 if self.last else 1)
        mark_batch(batch, self.last)
        return self.last


def mark_batch(batch: Any, draw: Draw, depth: int = 0) -> None:
    """Set ``draw`` on every tensor of ``batch`` (tensors, mappings, tuples and lists of them)."""
    if isinstance(batch, Tensor):
        setattr(batch, DRAW_ATTRIBUTE, draw)  # a Tensor takes Python attributes; views find it on ._base
    elif depth < 4 and isinstance(batch, (Mapping, tuple, list)):
        for value in batch.values() if isinstance(batch, Mapping) else batch:
            if isinstance(value, (Tensor, Mapping, tuple, list)):
                mark_batch(value, draw, depth + 1)


def draws_in(inputs: Any, depth: int = 0) -> set[Draw]:
    """The :class:`Draw` marks of the tensors in ``inputs`` (or of the tensors they are views of).

    A tensor that a :class:`~dpnotebook.privacy.data_loader.DPDataLoader` handed out, or a slice of one (a ``BatchMemoryManager``
    piece), carries its batch's mark; a copy (moved to another device, transformed) carries none.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from dpnotebook.privacy.data_loader import DPDataLoader
    >>> loader = DPDataLoader(TensorDataset(torch.randn(10, 2)), sample_rate=1.0)
    >>> (x,) = next(iter(loader))
    >>> draws_in(x[:3]) == {loader.draws.last}, draws_in(x + 1)
    (True, set())
    """
    found: set[Draw] = set()
    if isinstance(inputs, Tensor):
        for tensor in (inputs, inputs._base):
            draw = getattr(tensor, DRAW_ATTRIBUTE, None)
            if isinstance(draw, Draw):
                found.add(draw)
    elif depth < 4 and isinstance(inputs, (Mapping, tuple, list)):
        for value in inputs.values() if isinstance(inputs, Mapping) else inputs:
            if isinstance(value, (Tensor, Mapping, tuple, list)):
                found |= draws_in(value, depth + 1)
    return found
