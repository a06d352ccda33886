"""Opacus' optimizer names (``opacus.optimizers``, ``.optimizer``) over dpnotebook's DP optimizers.

``DPOptimizer``'s ``add_noise`` reads each ``p.summed_grad`` and writes ``p.grad``, so a subclass can add
other noise (and does its own accounting, as in Opacus). ``AdaClipDPOptimizer`` is refused.

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
>>> get_optimizer_class(clipping="flat", distributed=False, grad_sample_mode="ghost").__name__
'GhostDPOptimizer'
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from dpnotebook.errors import UnsupportedOptionError
from dpnotebook.privacy import DPOptimizer as _CoreDPOptimizer
from dpnotebook.privacy import GhostDPOptimizer
from dpnotebook.privacy._distributed import DistributedDPOptimizer, distributed_optimizer_class
from dpnotebook.privacy._mechanisms import draw_noise
from dpnotebook.privacy._step import SumAndNoiseNorms, _check_processed_flag, _mark_as_processed

__all__ = [
    "DPOptimizer",
    "_check_processed_flag",
    "_mark_as_processed",
    "DPPerLayerOptimizer",
    "DPOptimizerFastGradientClipping",
    "AdaClipDPOptimizer",
    "get_optimizer_class",
    "DistributedDPOptimizer",
]


class DPOptimizer(_CoreDPOptimizer):
    """dpnotebook's DP optimizer with Opacus' overridable ``add_noise`` (same constructor)."""

    _writing_noise = False  # True while the logical batch's finish asks add_noise for the noisy sum

    def add_noise(self) -> None:
        """``p.grad = p.summed_grad + N(0, (noise_multiplier * max_grad_norm)^2)``; override for other noise.

        Called by your own loop (``clip_and_accumulate(); add_noise(); ...``), it finishes the logical batch
        as :meth:`step` does, with every check (a raw gradient left on a parameter, the batch's draw), and
        calls itself back for the noise.
        """
        if not self._writing_noise:
            self._finish_batch()
            return
        std = self.noise_multiplier * self.max_grad_norm
        for p, noise in zip(self.params, draw_noise(self.params, std, self.generator, self.secure_mode), strict=True):
            p.grad = getattr(p, "summed_grad") + noise  # set by _noisy_sum (torch's Parameter does not declare it)

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], SumAndNoiseNorms]:
        for p, s in zip(params, summed, strict=True):
            setattr(p, "summed_grad", s.detach())  # clip_and_accumulate sets it too
        self._writing_noise = True
        try:
            self.add_noise()
        finally:
            self._writing_noise = False
        grads = [cast(Tensor, p.grad) for p in params]  # add_noise's contract: it sets every p.grad
        return grads, SumAndNoiseNorms(summed, [g - s for g, s in zip(grads, summed, strict=True)])


DPPerLayerOptimizer = DPOptimizer  #: Opacus' per-layer optimizer: ``DPOptimizer`` with ``clipping="per_layer"``.
DPOptimizerFastGradientClipping = GhostDPOptimizer  #: Opacus' ghost-clipping optimizer.


class AdaClipDPOptimizer:
    """Opacus' adaptive clipping: refused (its noisy count spends privacy the accountant does not record)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise UnsupportedOptionError(
            "AdaClipDPOptimizer (clipping='adaptive') is not supported: its noisy count of unclipped samples "
            "spends privacy that dpnotebook's accountant does not record. Fix: DPOptimizer with a fixed "
            "max_grad_norm, or a grad-clip scheduler (dpnotebook.schedulers)."
        )


def get_optimizer_class(clipping: str, distributed: bool, grad_sample_mode: str | None = None) -> type:
    """The optimizer class for these options, as Opacus' ``get_optimizer_class`` picks it (all-reducing if asked)."""
    if clipping == "adaptive":
        return AdaClipDPOptimizer  # refused when built, distributed or not
    if distributed:  # the all-reducing version of the core class
        base = get_optimizer_class(clipping, False, grad_sample_mode)
        return distributed_optimizer_class(_CoreDPOptimizer if base is DPOptimizer else base)
    if clipping not in ("flat", "per_layer"):
        raise ValueError(f"clipping={clipping!r} is unknown; choose one of ['adaptive', 'flat', 'per_layer'].")
    if grad_sample_mode == "ghost" and clipping != "flat":
        raise ValueError(f"clipping={clipping!r} with grad_sample_mode='ghost': Opacus' ghost optimizer clips flat.")
    return GhostDPOptimizer if grad_sample_mode == "ghost" else DPOptimizer
