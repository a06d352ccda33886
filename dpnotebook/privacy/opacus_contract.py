"""The read-only part of Opacus' optimizer contract, on every dpnotebook DP optimizer.

Opacus code (and Opacus' own tests) reads ``optimizer.grad_samples``,
``optimizer.accumulated_iterations`` and calls ``optimizer.pre_step()`` on the
optimizer ``make_private`` returns. These members only read or advance the same
state :class:`~dpnotebook.privacy.optimizer.DPOptimizer` keeps, so every DP
optimizer (ghost, distributed) has them. Overriding ``add_noise`` with
``p.summed_grad`` is the subclassing part: :class:`dpnotebook.optimizers.DPOptimizer`.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> from dpnotebook.privacy.optimizer import DPOptimizer
>>> model = wrap_model(nn.Linear(2, 1), "hooks")
>>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
...                   max_grad_norm=1.0, expected_batch_size=3)
>>> model(torch.randn(3, 2)).sum().backward()
>>> [tuple(g.shape) for g in opt.grad_samples], opt.accumulated_iterations
([(3, 1, 2), (3, 1)], 1)
>>> opt.signal_skip_step(); opt.pre_step()       # a skipped step: clipped and kept for the next
False
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor, nn


class _DPOptimizerState(Protocol):
    """What the contract reads: the state of the DP optimizer it is a base of."""

    _skip_next_step: bool

    @property
    def params(self) -> list[nn.Parameter]: ...

    def virtual_step(self) -> None: ...


class OpacusOptimizerContract:
    """``grad_samples``, ``accumulated_iterations`` and ``pre_step`` over a DP optimizer's own state."""

    @property
    def grad_samples(self: _DPOptimizerState) -> list[Tensor]:
        """The ``grad_sample`` of each parameter that has one (Opacus' ``optimizer.grad_samples``)."""
        found = [getattr(p, "grad_sample", None) for p in self.params]  # the wrapper's attribute, not torch's
        return [g for g in found if g is not None]

    @property
    def accumulated_iterations(self) -> int:
        """1: dpnotebook refuses two Poisson batches before one step (the accountant counts one per step)."""
        return 1

    def pre_step(self: _DPOptimizerState, closure: Callable[[], Any] | None = None) -> bool:
        """Clip and accumulate what is present; ``False`` if the step is to be skipped (a virtual step)."""
        self.virtual_step()
        if self._skip_next_step:
            self._skip_next_step = False
            return False
        return True


__all__ = ["OpacusOptimizerContract"]
