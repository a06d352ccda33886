"""``GhostDPOptimizer``: DP-SGD with ghost clipping (no per-sample gradients in memory).

It is a :class:`~dpnotebook.privacy.optimizer.DPOptimizer` whose clipping step
asks the ghost wrapper (:mod:`dpnotebook.grad_sample.ghost._wrapper`) for every sample's
gradient norm and then for the clip-factor-weighted sum of the gradients,
instead of reading ``p.grad_sample``. Noise, scaling, virtual steps, the
statistics and the step hooks are the base class's.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> model = wrap_model(nn.Linear(3, 1), "ghost")
>>> opt = GhostDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
...                        max_grad_norm=1.0, expected_batch_size=4)
>>> model(torch.randn(4, 3)).sum().backward()
>>> opt.step()
>>> opt.last_step_stats.per_sample_norms.shape
torch.Size([4])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.ghost._wrapper import GhostGradSampleModule, ghost_owner
from dpnotebook.modes import mode_class
from dpnotebook.privacy._mechanisms import clip_factors, layer_bound_list
from dpnotebook.privacy.optimizer import DPOptimizer

__all__ = ["GhostDPOptimizer", "MODE_OPTIMIZERS", "optimizer_class"]


def _owners_of(params: list[nn.Parameter]) -> list[GhostGradSampleModule]:
    """The ghost wrappers holding ``params``, each once."""
    owners = {id(o): o for o in (ghost_owner(p) for p in params) if o is not None}
    return list(owners.values())


class GhostDPOptimizer(DPOptimizer):
    """A :class:`~dpnotebook.privacy.optimizer.DPOptimizer` for models wrapped in ghost mode (same arguments).

    The wrapper is found from the optimizer's parameters, so the model must be
    wrapped (``wrap_model(model, "ghost")``) before the first :meth:`step`.
    """

    #: Its model computes norms, not ``p.grad_sample``: Opacus' ``criterion=`` wrapping applies.
    fast_gradient_clipping = True

    def _owners(self) -> list[GhostGradSampleModule]:
        owners = _owners_of(self.params)
        if not owners:
            raise RuntimeError(
                "GhostDPOptimizer found no ghost-mode model holding its parameters. Fix: wrap the model "
                "with dpnotebook.wrap_model(model, 'ghost') (or make_private(grad_sample_mode='ghost')) "
                "and build the optimizer from that model's parameters."
            )
        return owners

    @property
    def accumulated_iterations(self) -> int:
        """1, as Opacus' ghost-clipping optimizer: its model keeps norms, not a list of backward passes."""
        return 1

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, int] | None:
        """``(clipped sums in self.params order, per-sample norms, number clipped)``, or ``None`` for no samples."""
        params = self.params
        owners = self._owners()
        if len(owners) > 1:
            raise RuntimeError(
                "GhostDPOptimizer's parameters belong to several ghost-mode models; use one optimizer per model."
            )
        model = owners[0]
        B = model.num_samples()
        if B == 0:
            return None
        sq = model.sq_norms()
        layer_sq = torch.stack([sq[p] if p in sq else p.new_zeros(B) for p in params])  # [L, B]
        norms = layer_sq.sum(0).sqrt()
        if self.clipping == "flat":
            factors = clip_factors(norms, self.max_grad_norm)
            weights: dict[nn.Parameter, Tensor] = {p: factors for p in params}
            clipped = int((factors < 1).sum())
        else:
            bounds = layer_bound_list(self.max_grad_norms or self.max_grad_norm, len(params))
            factors = torch.stack([clip_factors(n, c) for n, c in zip(layer_sq.sqrt(), bounds, strict=True)])
            weights = dict(zip(params, factors, strict=True))
            clipped = int((factors < 1).any(0).sum())
        sums = model.weighted_sums(weights)
        return [sums[p] if p in sums else torch.zeros_like(p) for p in params], norms, clipped

    def _forget_clipped(self) -> None:
        """Forget the ghost records of the piece just clipped: no later step may clip them again."""
        for model in self._owners():
            model.clear_ghost()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and the ghost wrapper's records."""
        super().zero_grad(set_to_none=set_to_none)
        for model in _owners_of(self.params):
            model.clear_ghost()


#: The DP optimizer ``make_private`` builds per grad-sample mode; a mode not in it gets :class:`DPOptimizer`.
#: The privacy side owns this table, so the mode registry (:mod:`dpnotebook.modes`) never names an optimizer.
MODE_OPTIMIZERS: dict[str, type[DPOptimizer]] = {"ghost": GhostDPOptimizer}


def optimizer_class(mode: str) -> type[DPOptimizer]:
    """The DP optimizer class ``make_private`` builds for a model wrapped in grad-sample mode ``mode``.

    >>> optimizer_class("ghost").__name__, optimizer_class("hooks").__name__
    ('GhostDPOptimizer', 'DPOptimizer')

    Raises:
        ValueError: ``mode`` is not a registered grad-sample mode.
    """
    mode_class(mode)  # an unknown mode is refused here, naming the registered ones
    return MODE_OPTIMIZERS.get(mode, DPOptimizer)
