"""What the Poisson loader sampled since the last step, checked against what the optimizer clipped.

The accountant counts one Poisson-sampled step per ``optimizer.step()``. That
is only true if the step's clipped sum holds the samples of exactly one
sampled batch, one per-sample gradient per example:

* two batches drawn and trained on before one step would share one noise
  draw and one accountant step, so epsilon would be under-counted;
* more (or fewer) per-sample norms than examples mean rows are not samples
  (a collate that emits ``K`` rows per example without ``K``, a wrong
  ``batch_first``), and one example can move the sum by more than ``C``.

A :class:`~dpnotebook.privacy.data_loader.DPDataLoader` tells its listeners how
many examples each batch it hands out holds; the optimizer keeps them in a
:class:`SampledBatches` and calls :meth:`SampledBatches.check` at each step.

>>> batches = SampledBatches()
>>> batches.drawn(5)
>>> batches.check(5)                  # one batch of 5 examples, 5 norms clipped
>>> batches.drawn(4); batches.drawn(6)
>>> batches.check(10)
Traceback (most recent call last):
...
RuntimeError: one optimizer step clipped the samples of 2 Poisson batches (4 + 6 examples)...: epsilon would be under-counted. ...
"""

from __future__ import annotations

__all__ = ["SampledBatches"]


class SampledBatches:
    """The example counts of the batches a Poisson loader handed out since the last step."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def drawn(self, examples: int) -> None:
        """A batch of ``examples`` examples was handed to the training loop."""
        self.counts.append(int(examples))

    def check(self, clipped: int) -> None:
        """Raise unless the ``clipped`` per-sample norms of this step are the examples of the last batch drawn.

        Batches drawn earlier whose samples were not clipped (an evaluation pass
        over the same loader, a loop that broke off) are forgotten. Does nothing
        when no batch was drawn (the loader is not a Poisson loader of this optimizer).
        """
        counts, self.counts = self.counts, []
        if not counts:
            return
        total = 0
        for used in range(1, len(counts) + 1):  # the shortest run of last batches that the norms cover
            total += counts[-used]
            if total >= clipped:
                break
        if total == clipped and used == 1:
            return
        if total == clipped:
            shown = " + ".join(str(c) for c in counts[-used:])
            raise RuntimeError(
                f"one optimizer step clipped the samples of {used} Poisson batches ({shown} examples), but "
                "noise is drawn and the accountant counts a step once per optimizer.step(): epsilon would be "
                "under-counted. Fix: call optimizer.step() after each batch; to train on a batch too large "
                "for memory, split that ONE batch with BatchMemoryManager (or split_batch + virtual_step)."
            )
        raise RuntimeError(
            f"this step clipped {clipped} per-sample gradients, but the Poisson loader sampled {counts[-1]} "
            "examples for it: the rows that were clipped are not the examples. Likely causes: a collate "
            "that emits K rows per example while K was not passed (make_private(K=...)), batch_first that "
            "does not say where the batch dimension is, a model that adds or drops rows, or two forward "
            "passes of the batch before one backward (Opacus sums them into one row per example; dpnotebook "
            "keeps each pass's rows and refuses, since two rows of one example would each be clipped to C: "
            "make one forward pass give one row per example (a module that takes both inputs), or step "
            "after each pass)."
        )
