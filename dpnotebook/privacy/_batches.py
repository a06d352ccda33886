"""Every clipped sum comes from the one batch the DP loader drew for that logical step.

The accountant counts one Poisson-sampled step at rate ``q`` per ``optimizer.step()``. That is only true if
the step's clipped sum holds the samples of exactly one batch that the optimizer's ``DPDataLoader`` drew for
it, one per-sample gradient per example. :meth:`SampledBatches.check` (called once per logical step by
``DPOptimizer.add_noise``) refuses anything else:

* **no batch drawn since the last step**: a loop over the *original* ``DataLoader`` after ``make_private``
  (issue #28 measured 2.48 reported against at least 4.38 spent), or ``step()`` called twice on one batch;
* **two batches drawn and trained on before one step**: one noise draw, one accountant step for both;
* **more (or fewer) per-sample norms than examples**: rows are not samples (``K`` rows per example without
  ``K``, a wrong ``batch_first``).

Provenance decides where it can: the loader marks every tensor of a batch with its :class:`Draw`
(:class:`DrawMarker`), and the tied model records the marks of its inputs when a backward pass goes through
them (views keep the mark on ``._base``; a copy moved or transformed carries none, and then the number of
examples decides). A batch drawn but not trained on is forgotten at the next draw's step. A ``DPOptimizer``
with no loader tied is not checked: its ``q`` is then *assumed* to be your own loop's Poisson rate.

>>> batches = SampledBatches()
>>> batches.check(7)                  # standalone: nothing to compare with
>>> batches.tied = True               # what tie(loader) sets
>>> batches.drawn(5)
>>> batches.check(5)                  # one batch of 5 examples, 5 norms clipped
>>> batches.drawn(4); batches.drawn(6)
>>> batches.check(10)
Traceback (most recent call last):
...
RuntimeError: one optimizer step clipped the samples of 2 Poisson batches (4 + 6 examples)...: epsilon would be under-counted. ...
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

    A tensor that a ``DPDataLoader`` handed out, or a slice of one (a ``BatchMemoryManager``
    piece), carries its batch's mark; a copy (moved to another device, transformed) carries none.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from dpnotebook.privacy._data import DPDataLoader
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


def _tensors(output: Any, depth: int = 0) -> list[Tensor]:
    if isinstance(output, Tensor):
        return [output]
    if depth < 4 and isinstance(output, dict):
        output = list(output.values())
    if depth < 4 and isinstance(output, (tuple, list)):
        return [t for value in output for t in _tensors(value, depth + 1)]
    return []


class SampledBatches:
    """What a tied DP loader handed out since the last step, and which of its batches were trained on.

    Attributes:
        counts: the examples of each batch handed out since the last step, in order.
        draws: the :class:`~dpnotebook.privacy._batches.Draw` of each of them (``None`` unknown).
        tied: whether a :class:`~dpnotebook.privacy.DPDataLoader` reports to it
            (only then does :meth:`check` refuse anything).
    """

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.draws: list[Draw | None] = []
        self.tied = False
        self._marker: DrawMarker | None = None  # the tied loader's (a small object: the model may be pickled)
        self._pending: set[Draw] = set()  # marks a backward pass went through, not clipped yet
        self._clipped: set[Draw] = set()  # marks of the rows clipped into this logical step

    def tie(self, data_loader: Any, module: nn.Module | None = None) -> None:
        """Have ``data_loader`` (a ``DPDataLoader``) report every batch it hands out; steps are then checked.

        With ``module`` (the wrapped model), the marks of the batches whose outputs a backward
        pass goes through are recorded too, so that :meth:`check` decides by provenance.
        """
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
        """Forward hook: when the output's gradient flows back, its inputs' marks are recorded."""
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

    def rows_clipped(self) -> None:
        """The optimizer clipped the rows of the backward passes so far into the step's sum (``virtual_step``)."""
        self._clipped |= self._pending
        self._pending = set()

    def rows_dropped(self, *, clipped_too: bool = False) -> None:
        """The optimizer's ``zero_grad()`` dropped the per-sample gradients not clipped yet.

        With ``clipped_too``, it also dropped the logical step's clipped sum (a bare
        ``clip_and_accumulate()`` before ``zero_grad()``), so those rows are no longer in the step.
        """
        self._pending = set()
        if clipped_too:
            self._clipped = set()

    def check(self, clipped: int) -> None:
        """Raise unless the ``clipped`` per-sample norms of this step are the examples of the last batch drawn.

        Batches drawn earlier whose samples were not clipped (an evaluation pass
        over the same loader, a loop that broke off) are forgotten. Does nothing
        when no loader is tied (a standalone optimizer: see the module docstring).
        """
        counts, self.counts = self.counts, []
        draws, self.draws = self.draws, []
        trained, self._clipped = self._clipped, set()
        if not self.tied:
            return
        if not counts:
            raise RuntimeError(
                f"this optimizer step clipped {clipped} per-sample gradients, but its DPDataLoader handed out "
                "no batch since the last step: the samples were not drawn for this step. The accountant "
                "counts each step as a Poisson sample at rate q, so epsilon would be under-counted. Likely "
                "causes: a loop over the original DataLoader after make_private (its fixed batches put every "
                "example in a known step), or optimizer.step() called twice for one batch. Fix: iterate over "
                "the data loader that make_private returned, and call optimizer.step() once per batch it yields."
            )
        if trained:  # the batches are known by their marks: provenance decides
            foreign = trained - set(draws)
            if foreign:
                shown = ", ".join(f"batch {d.number} of loader {d.loader}" for d in sorted(foreign))
                raise RuntimeError(
                    f"this optimizer step clipped the samples of a batch that its DPDataLoader did not hand out "
                    f"since the last step ({shown}; it handed out {_describe(draws)}): a batch drawn for an "
                    "earlier step, or by another loader. Each Poisson batch must be trained on in the one step "
                    "it was drawn for, or the accountant's q does not describe the run. Fix: train each step "
                    "on the batch that the loader make_private returned has just handed out, once."
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
        "noise is drawn and the accountant counts a step once per optimizer.step(): epsilon would be "
        "under-counted. Fix: call optimizer.step() after each batch; to train on a batch too large "
        "for memory, split that ONE batch with BatchMemoryManager (or split_batch + virtual_step)."
    )


def _rows_not_examples(clipped: int, examples: int) -> None:
    raise RuntimeError(
        f"this step clipped {clipped} per-sample gradients, but the Poisson loader sampled {examples} "
        "examples for it: the rows that were clipped are not the examples. Likely causes: a collate "
        "that emits K rows per example while K was not passed (make_private(K=...)), batch_first that "
        "does not say where the batch dimension is, a model that adds or drops rows, a batch that the "
        "loader did not draw (another DataLoader), or two forward "
        "passes of the batch before one backward (one row per example summed from both would hide it; this library "
        "keeps each pass's rows and refuses, since two rows of one example would each be clipped to C: "
        "make one forward pass give one row per example (a module that takes both inputs), or step "
        "after each pass)."
    )
