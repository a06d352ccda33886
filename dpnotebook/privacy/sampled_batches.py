"""Every clipped sum comes from a batch the DP loader drew for that logical step.

The accountant counts one Poisson-sampled step at rate ``q`` per
``optimizer.step()``. That is only true if the step's clipped sum holds the
samples of exactly one batch that the optimizer's
:class:`~dpnotebook.privacy.data_loader.DPDataLoader` drew for it, one
per-sample gradient per example. Anything else is refused at the step:

* **no batch drawn since the last step**: the samples came from elsewhere (a
  loop over the *original* ``DataLoader`` after ``make_private``, whose fixed
  batches put each example in one known step: issue #28 measured 2.48 reported
  against at least 4.38 spent), or ``step()`` was called twice on one batch;
* **two batches drawn and trained on before one step**: they would share one
  noise draw and one accountant step;
* **more (or fewer) per-sample norms than examples**: rows are not samples (a
  collate that emits ``K`` rows per example without ``K``, a wrong ``batch_first``).

The first is decided by provenance, not by a count: the loader tells its
optimizer every batch it hands out, and a step without one is refused whatever
it clipped. The enforcement is here, in :meth:`SampledBatches.check`, which
:meth:`DPOptimizer.add_noise <dpnotebook.privacy.optimizer.DPOptimizer.add_noise>`
calls once per logical step; :meth:`SampledBatches.tie` connects a loader to it
(``make_private`` does). A batch drawn but not trained on (an evaluation pass
over the loader, a loop that broke off) is forgotten at the next draw's step.

A ``DPOptimizer`` used standalone (no loader tied to it, e.g. built by hand with
your own sampler) is not checked: its accountant's ``q`` is then *assumed* to be
the rate at which your own loop Poisson-samples each batch, one batch per step.

>>> batches = SampledBatches()
>>> batches.check(7)                  # standalone: nothing to compare with
>>> batches.tied = True               # what tie(loader) sets
>>> batches.drawn(5)
>>> batches.check(5)                  # one batch of 5 examples, 5 norms clipped
>>> batches.check(1)
Traceback (most recent call last):
...
RuntimeError: this optimizer step clipped 1 per-sample gradients, but its DPDataLoader handed out no batch since the last step...
>>> batches.drawn(4); batches.drawn(6)
>>> batches.check(10)
Traceback (most recent call last):
...
RuntimeError: one optimizer step clipped the samples of 2 Poisson batches (4 + 6 examples)...: epsilon would be under-counted. ...
"""

from __future__ import annotations

from typing import Any

__all__ = ["SampledBatches"]


class SampledBatches:
    """The example counts of the batches a tied DP loader handed out since the last step.

    Attributes:
        counts: the examples of each batch handed out since the last step, in order.
        tied: whether a :class:`~dpnotebook.privacy.data_loader.DPDataLoader` reports to it
            (only then does :meth:`check` refuse anything).
    """

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.tied = False

    def tie(self, data_loader: Any) -> None:
        """Have ``data_loader`` (a ``DPDataLoader``) report every batch it hands out; steps are then checked."""
        data_loader.batch_listeners.append(self.drawn)
        self.tied = True

    def drawn(self, examples: int) -> None:
        """A batch of ``examples`` examples was handed to the training loop."""
        self.counts.append(int(examples))

    def check(self, clipped: int) -> None:
        """Raise unless the ``clipped`` per-sample norms of this step are the examples of the last batch drawn.

        Batches drawn earlier whose samples were not clipped (an evaluation pass
        over the same loader, a loop that broke off) are forgotten. Does nothing
        when no loader is tied (a standalone optimizer: see the module docstring).
        """
        counts, self.counts = self.counts, []
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
            "does not say where the batch dimension is, a model that adds or drops rows, a batch that the "
            "loader did not draw (another DataLoader), or two forward "
            "passes of the batch before one backward (Opacus sums them into one row per example; dpnotebook "
            "keeps each pass's rows and refuses, since two rows of one example would each be clipped to C: "
            "make one forward pass give one row per example (a module that takes both inputs), or step "
            "after each pass)."
        )
