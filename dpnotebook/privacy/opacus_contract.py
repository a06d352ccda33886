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

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor, nn

from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts, grad_sample_rows


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
        """The ``grad_sample`` of each parameter that has one, every backward pass's rows in one tensor.

        Opacus' ``optimizer.grad_samples``: a list ``p.grad_sample`` (several backward passes
        before one step) is concatenated, as its ``_get_flat_grad_sample`` does.
        """
        found = [grad_sample_rows(p) for p in self.params]
        return [g for g in found if g is not None]

    def _get_flat_grad_sample(self, p: Tensor) -> Tensor:
        """``p.grad_sample`` as one tensor, the backward passes' rows concatenated (Opacus' method, same name).

        Raises:
            ValueError: ``p`` has no per-sample gradients (as in Opacus).
        """
        if not hasattr(p, "grad_sample"):
            raise ValueError(
                "Per sample gradient not found: the parameter has no grad_sample. Fix: wrap the model "
                "(PrivacyEngine.make_private or dpnotebook.wrap_model) before the forward pass."
            )
        rows = grad_sample_rows(p)
        if rows is None:
            raise ValueError(
                "Per sample gradient is not initialized: p.grad_sample is None (no backward pass since "
                "zero_grad, or the parameter is not used by the forward pass)."
            )
        return rows

    def attach_step_hook(self: _DPOptimizerState, hook: Callable[[Any], None]) -> None:
        """Call ``hook(optimizer)`` after every step (Opacus' method; the privacy engine steps its accountant so)."""
        self.step_hooks.append(hook)

    def signal_skip_step(self: _DPOptimizerState, do_skip: bool = True) -> None:
        """Make the next ``step()`` a ``virtual_step()`` (as Opacus' ``BatchMemoryManager`` does)."""
        self._skip_next_step = do_skip

    @property
    def accumulated_iterations(self: _DPOptimizerState) -> int:
        """How many backward passes ``p.grad_sample`` holds (Opacus' property): its list's length, 1 for a tensor.

        Under Poisson sampling it is 1 at every step: two batches before one step are refused.

        Raises:
            ValueError: the parameters hold different numbers of backward passes (as in Opacus).
        """
        counts = {len(grad_sample_parts(p)) for p in self.params if getattr(p, "grad_sample", None) is not None}
        if len(counts) > 1:
            raise ValueError(
                f"Number of accumulated steps is inconsistent across parameters: {sorted(counts)} backward "
                "passes. Some parameters were not reached by every backward pass since zero_grad()."
            )
        return counts.pop() if counts else 1

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
