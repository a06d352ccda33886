"""``opacus.optimizers.optimizer`` under dpnotebook: ``DPOptimizer`` with Opacus' subclassing contract.

dpnotebook's :class:`~dpnotebook.privacy.DPOptimizer` finishes a logical
batch in one method. Opacus code subclasses its optimizer and overrides pieces:
``add_noise`` reads each ``p.summed_grad`` (the clipped sum) and writes ``p.grad``
(e.g. Laplace noise instead of Gaussian). This subclass gives that contract over
the same clipping, checks, scaling and statistics:

* ``p.summed_grad``: the clipped sum of the logical batch, set before :meth:`add_noise`;
* :meth:`add_noise`: ``p.grad = p.summed_grad + N(0, (sigma C)^2)``, overridable;
* :meth:`pre_step`, :meth:`clip_and_accumulate`, :attr:`grad_samples`, :attr:`accumulated_iterations`,
  ``signal_skip_step`` (on every dpnotebook DP optimizer, :mod:`~dpnotebook.privacy._optimizer`);
* ``_check_processed_flag`` and ``_mark_as_processed``, Opacus' private helpers (its Laplace-noise
  tutorial imports them from here): :mod:`~dpnotebook.privacy.step_invariants`.

The accountant still assumes Gaussian noise of ``noise_multiplier * max_grad_norm``:
a subclass that adds other noise must do its own accounting, as in Opacus.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> class NoNoise(DPOptimizer):
...     def add_noise(self):
...         for p in self.params:
...             p.grad = p.summed_grad.clone()
>>> model = wrap_model(nn.Linear(2, 1), "hooks", loss_reduction="sum")
>>> opt = NoNoise(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
...               max_grad_norm=1e6, expected_batch_size=4, loss_reduction="sum", secure_mode=False)
>>> x = torch.randn(4, 2)
>>> model(x).sum().backward()
>>> opt.step()
>>> torch.allclose(model.weight.grad, x.sum(0, keepdim=True))
True
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from dpnotebook.privacy import DPOptimizer as _CoreDPOptimizer
from dpnotebook.privacy.noise import draw_noise
from dpnotebook.privacy.step_invariants import _check_processed_flag, _mark_as_processed
from dpnotebook.privacy.step_stats import total_norm

__all__ = ["DPOptimizer", "_check_processed_flag", "_mark_as_processed"]


def _summed_grad(p: nn.Parameter) -> Tensor:
    """``p.summed_grad``: set by this optimizer for :meth:`DPOptimizer.add_noise`; torch's Parameter does not declare it."""
    return getattr(p, "summed_grad")


class DPOptimizer(_CoreDPOptimizer):
    """dpnotebook's DP optimizer with Opacus' overridable ``add_noise`` (same constructor)."""

    def add_noise(self) -> None:
        """``p.grad = p.summed_grad + N(0, (noise_multiplier * max_grad_norm)^2)``; override for other noise."""
        std = self.noise_multiplier * self.max_grad_norm
        params = self.params
        for p, noise in zip(params, draw_noise(params, std, self.generator, self.secure_mode), strict=True):
            p.grad = _summed_grad(p) + noise

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], float, float]:
        for p, s in zip(params, summed, strict=True):
            setattr(p, "summed_grad", s.detach())  # (see _summed_grad); clip_and_accumulate set it too
        self.add_noise()
        grads = [cast(Tensor, p.grad) for p in params]  # add_noise's contract: it sets every p.grad
        noise_norm = total_norm([g - s for g, s in zip(grads, summed, strict=True)])
        return grads, total_norm(summed), noise_norm
