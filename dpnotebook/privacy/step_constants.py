"""A logical step's constants: the privacy knobs of a DP optimizer, and the snapshot that keeps them fixed.

:class:`PrivacyKnobs` validates ``noise_multiplier`` and ``max_grad_norm`` whenever
they are set (by the constructor, a setter, a scheduler). :class:`StepConstants`
is the invariant that they, the expected batch size, the clipping and ``K`` do not
change while a logical batch is accumulated: :meth:`DPOptimizer.clip_and_accumulate
<dpnotebook.privacy.DPOptimizer.clip_and_accumulate>` reads them at the first piece
and checks them at every later piece and at the step, so clipping and noise always use the
same ``C`` (``docs/guarantees.md``, "Invariants of the DP step").

>>> knobs = PrivacyKnobs()
>>> knobs.max_grad_norm = [1.0, 2.0]                 # per-layer bounds: their total is C
>>> round(knobs.max_grad_norm, 4), knobs.max_grad_norms
(2.2361, [1.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpnotebook.privacy._arguments import check_max_grad_norm, check_noise_multiplier
from dpnotebook.privacy.layer_bounds import total_bound

__all__ = ["PrivacyKnobs", "StepConstants"]


class PrivacyKnobs:
    """``noise_multiplier`` (sigma) and ``max_grad_norm`` (C, or per-layer bounds), validated whenever set."""

    max_grad_norms: list[float] | None

    @property
    def noise_multiplier(self) -> float:
        return self._noise_multiplier

    @noise_multiplier.setter
    def noise_multiplier(self, value: float) -> None:
        self._noise_multiplier = check_noise_multiplier(value)

    @property
    def max_grad_norm(self) -> float:
        return self._max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float | list[float]) -> None:
        """A number C, or (per-layer clipping) Opacus' list of bounds: then ``max_grad_norm`` is their total."""
        if isinstance(value, (list, tuple)):
            self.max_grad_norms = [check_max_grad_norm(c) for c in value]
            self._max_grad_norm = total_bound(self.max_grad_norms)
        else:
            self.max_grad_norms = None
            self._max_grad_norm = check_max_grad_norm(value)


@dataclass(frozen=True)
class StepConstants:
    """The constants a logical batch's clipping and noise must share, read from a DP optimizer.

    >>> import torch
    >>> from dpnotebook.privacy._optimizer import DPOptimizer
    >>> opt = DPOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1),
    ...                   noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4, secure_mode=False)
    >>> first = StepConstants.of(opt)
    >>> opt.max_grad_norm = 0.5                           # a scheduler inside the logical batch
    >>> first.check(opt)
    Traceback (most recent call last):
    ...
    RuntimeError: max_grad_norm changed while a logical batch is accumulated: 1.0 when its first piece was clipped, 0.5 now...
    """

    noise_multiplier: float
    max_grad_norm: float
    max_grad_norms: tuple[float, ...] | None
    expected_batch_size: float
    clipping: str
    K: int | None

    @classmethod
    def of(cls, optimizer: Any) -> StepConstants:
        """The optimizer's constants now (``K``: its model's, if ``make_private`` told it the model)."""
        norms = optimizer.max_grad_norms
        module = optimizer._dp_model
        return cls(
            optimizer.noise_multiplier,
            optimizer.max_grad_norm,
            tuple(norms) if norms is not None else None,
            optimizer.expected_batch_size,
            optimizer.clipping,
            getattr(module, "K", None) if module is not None else None,
        )

    def check(self, optimizer: Any) -> None:
        """Raise if any constant of ``optimizer`` differs from these (read at the logical batch's first piece)."""
        now = StepConstants.of(optimizer)
        for name in self.__dataclass_fields__:
            before, after = getattr(self, name), getattr(now, name)
            if before != after:
                raise RuntimeError(
                    f"{name} changed while a logical batch is accumulated: {before} when its first piece was "
                    f"clipped, {after} now. Pieces clipped with one value and noise calibrated to another "
                    "break the privacy bound (e.g. pieces clipped at C, noise for C/2: one sample moves the "
                    "step by 2x the bound). Fix: change it (or step a noise or clipping scheduler) only "
                    "between logical batches: after the optimizer.step() that adds the noise, e.g. once per "
                    "epoch. Under BatchMemoryManager, step the scheduler after the loop over the physical "
                    "batches, not inside it."
                )
