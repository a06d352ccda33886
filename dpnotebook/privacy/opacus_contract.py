"""Opacus' optimizer contract, on every dpnotebook DP optimizer.

Opacus code (and Opacus' own tests) reads ``optimizer.grad_samples``,
``optimizer.accumulated_iterations`` and calls ``optimizer.pre_step()`` (and
``clip_and_accumulate()``, which :class:`~dpnotebook.privacy.optimizer.DPOptimizer`
defines) on the optimizer ``make_private`` returns. These members only read or
advance the same state :class:`~dpnotebook.privacy.optimizer.DPOptimizer` keeps, so
every DP optimizer (ghost, distributed) has them. Overriding ``add_noise`` with
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
>>> model(torch.randn(3, 2)).sum().backward()
>>> opt.pre_step(), model.weight.grad.shape       # the last piece: clipped, noised, scaled
(True, torch.Size([1, 2]))
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor, nn


class _DPOptimizerState(Protocol):
    """What the contract reads: the state of the DP optimizer it is a base of."""

    _skip_next_step: bool
    step_hooks: list[Callable[[Any], None]]

    @property
    def params(self) -> list[nn.Parameter]: ...

    def virtual_step(self) -> None: ...

    def _finish_batch(self) -> None: ...


class OpacusOptimizerContract:
    """``grad_samples``, ``accumulated_iterations``, ``pre_step``, ``attach_step_hook`` and ``signal_skip_step``."""

    @property
    def grad_samples(self: _DPOptimizerState) -> list[Tensor]:
        """The ``grad_sample`` of each parameter that has one (Opacus' ``optimizer.grad_samples``)."""
        found = [getattr(p, "grad_sample", None) for p in self.params]  # the wrapper's attribute, not torch's
        return [g for g in found if g is not None]

    def attach_step_hook(self: _DPOptimizerState, hook: Callable[[Any], None]) -> None:
        """Call ``hook(optimizer)`` after every step (Opacus' method; the privacy engine steps its accountant so)."""
        self.step_hooks.append(hook)

    def signal_skip_step(self: _DPOptimizerState, do_skip: bool = True) -> None:
        """Make the next ``step()`` a ``virtual_step()`` (as Opacus' ``BatchMemoryManager`` does)."""
        self._skip_next_step = do_skip

    @property
    def accumulated_iterations(self) -> int:
        """1: dpnotebook refuses two Poisson batches before one step (the accountant counts one per step)."""
        return 1

    def pre_step(self: _DPOptimizerState, closure: Callable[[], Any] | None = None) -> bool:
        """Opacus' ``pre_step``: everything of a step but the wrapped optimizer's own ``step()``.

        After ``signal_skip_step``: clip and accumulate (a virtual step) and return ``False``.
        Otherwise clip the last piece, add the noise, scale, run the step hooks and return ``True``.
        """
        if self._skip_next_step:
            self._skip_next_step = False
            self.virtual_step()
            return False
        self._finish_batch()
        for hook in self.step_hooks:
            hook(self)
        return True


__all__ = ["OpacusOptimizerContract"]
