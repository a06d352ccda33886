"""Every clipped sum comes from the one batch the DP loader drew for that logical step.

The accountant counts one Poisson-sampled step per ``optimizer.step()``. :meth:`SampledBatches.check`
(once per logical step) refuses a step without a batch drawn since the last one (a loop over the original
``DataLoader``), with two batches, or with more or fewer per-sample norms than examples. The loader marks
each batch's tensors with its :class:`Draw`, and the tied model records the marks its backward passes go
through; without marks the number of examples decides. An optimizer with no loader tied is not checked.

>>> batches = SampledBatches()
>>> batches.check(7)                  # standalone: nothing to compare with
>>> batches.tied = True               # what tie(loader) sets
>>> batches.drawn(5)
>>> batches.check(5)                  # one batch of 5 examples, 5 norms clipped
>>> batches.drawn(4); batches.drawn(6)
>>> batches.check(10)
Traceback (most recent call last):
...
RuntimeError: one optimizer step clipped the samples of 2 Poisson batches (4 + 6 examples)...: epsilon would be ...
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn


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


def _tensors(value: Any, depth: int = 0) -> list[Tensor]:
    """The tensors in ``value`` (tensors, and mappings, tuples and lists of them, 4 levels deep)."""
    if isinstance(value, Tensor):
        return [value]
    if depth < 4 and isinstance(value, (Mapping, tuple, list)):
        values = value.values() if isinstance(value, Mapping) else value
        return [t for v in values for t in _tensors(v, depth + 1)]
    return []


def mark_batch(batch: Any, draw: Draw) -> None:
    """Set ``draw`` on every tensor of ``batch`` (views find it on ``._base``)."""
    for tensor in _tensors(batch):
        setattr(tensor, DRAW_ATTRIBUTE, draw)


def draws_in(inputs: Any) -> set[Draw]:
    """The :class:`Draw` marks of the tensors in ``inputs`` (or of the tensors they are views of)."""
    marks = (getattr(t, DRAW_ATTRIBUTE, None) for tensor in _tensors(inputs) for t in (tensor, tensor._base))
    return {draw for draw in marks if isinstance(draw, Draw)}


class SampledBatches:
    """What a tied DP loader handed out since the last step, and which of its batches were trained on.

    Attributes:
        counts: the examples of each batch handed out since the last step, in order.
        draws: the :class:`Draw` of each of them (``None`` unknown).
        tied: whether a :class:`~dpnotebook.privacy.DPDataLoader` reports to it (only then are steps checked).
    """

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.draws: list[Draw | None] = []
        self.tied = False
        self._marker: DrawMarker | None = None  # the tied loader's
        self._pending: set[Draw] = set()  # marks a backward pass went through, not clipped yet
        self._clipped: set[Draw] = set()  # marks of the rows clipped into this logical step

    def tie(self, data_loader: Any, module: nn.Module | None = None) -> None:
        """Have ``data_loader`` report every batch it hands out, and ``module`` the marks its backward passes see."""
        data_loader.batch_listeners.append(self.drawn)
        self._marker = data_loader.draws
        self.tied = True
        if module is not None:
            module.register_forward_hook(self._forward, with_kwargs=True)

    def drawn(self, examples: int) -> None:
        """A batch of ``examples`` examples was handed to the training loop."""
        self.counts.append(int(examples))
        self.draws.append(self._marker.last if self._marker is not None else None)

    def _forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Forward hook: when the output's gradient flows back, record its inputs' marks."""
        if not torch.is_grad_enabled():
            return
        marks = draws_in((args, kwargs))
        if not marks:
            return
        for tensor in _tensors(output):
            if tensor.requires_grad:
                tensor.register_hook(partial(self._backward, frozenset(marks)))

    def _backward(self, marks: frozenset[Draw], grad: Tensor) -> None:
        self._pending |= marks

    def trained_on(self, batch: Any) -> None:
        """A step trains on ``batch``'s tensors, given directly (``GraphedStep``: the copies it runs carry no mark)."""
        self._pending |= draws_in(batch)

    def rows_clipped(self) -> None:
        """The optimizer clipped the rows of the backward passes so far into the step's sum."""
        self._clipped |= self._pending
        self._pending = set()

    def rows_dropped(self, *, clipped_too: bool = False) -> None:
        """``zero_grad()`` dropped the per-sample gradients not clipped yet (``clipped_too``: the clipped sum too)."""
        self._pending = set()
        if clipped_too:
            self._clipped = set()

    def check(self, clipped: int) -> None:
        """Raise unless the ``clipped`` per-sample norms of this step are the examples of the last batch drawn.

        Earlier batches not trained on are forgotten; without a tied loader nothing is checked.
        """
        counts, self.counts = self.counts, []
        draws, self.draws = self.draws, []
        trained, self._clipped = self._clipped, set()
        if not self.tied:
            return
        if not counts:
            raise RuntimeError(
                f"this optimizer step clipped {clipped} per-sample gradients, but its DPDataLoader handed out "
                "no batch since the last step, so epsilon would be under-counted. Likely causes: a loop over the "
                "original DataLoader after make_private, or optimizer.step() called twice for one batch. Fix: "
                "iterate over the data loader that make_private returned; call optimizer.step() once per batch."
            )
        if trained:  # the batches are known by their marks: provenance decides
            foreign = trained - set(draws)
            if foreign:
                shown = ", ".join(f"batch {d.number} of loader {d.loader}" for d in sorted(foreign))
                raise RuntimeError(
                    f"this optimizer step clipped the samples of a batch that its DPDataLoader did not hand out "
                    f"since the last step ({shown}; it handed out {_describe(draws)}): a batch drawn for an "
                    "earlier step, or by another loader. Fix: train each step on the batch that the loader "
                    "make_private returned has just handed out, once."
                )
            used = [i for i, d in enumerate(draws) if d in trained]
            if len(used) > 1:
                _several_batches([counts[i] for i in used])
            if used[0] != len(draws) - 1:
                raise RuntimeError(
                    f"this optimizer step clipped the samples of {_describe(draws[used[0] : used[0] + 1])}, but its "
                    f"DPDataLoader has handed out {len(draws) - 1 - used[0]} more since: a step must train on the "
                    "last batch drawn. Fix: call optimizer.step() for each batch before drawing the next one."
                )
            if clipped != counts[-1]:
                _rows_not_examples(clipped, counts[-1])
            return
        total = 0
        for used_batches in range(1, len(counts) + 1):  # the shortest run of last batches that the norms cover
            total += counts[-used_batches]
            if total >= clipped:
                break
        if total == clipped and used_batches == 1:
            return
        if total == clipped:
            _several_batches(counts[-used_batches:])
        _rows_not_examples(clipped, counts[-1])


def _describe(draws: list[Draw | None]) -> str:
    return ", ".join(f"batch {d.number} of loader {d.loader}" if d else "a batch" for d in draws)


def _several_batches(counts: list[int]) -> None:
    shown = " + ".join(str(c) for c in counts)
    raise RuntimeError(
        f"one optimizer step clipped the samples of {len(counts)} Poisson batches ({shown} examples), but "
        "the accountant counts one step: epsilon would be under-counted. Fix: call optimizer.step() after "
        "each batch; split a batch too large for memory with BatchMemoryManager."
    )


def _rows_not_examples(clipped: int, examples: int) -> None:
    raise RuntimeError(
        f"this step clipped {clipped} per-sample gradients, but the Poisson loader sampled {examples} "
        "examples for it: the rows clipped are not the examples. Likely causes: K rows per example while K "
        "was not passed (make_private(K=...)), a wrong batch_first, a model that adds or drops rows, a batch "
        "from another DataLoader, or two forward passes of the batch before one backward. Fix: one row per "
        "example per step (one forward pass taking both inputs, or a step after each pass)."
    )
