"""``GhostDPOptimizer``: DP-SGD with ghost clipping (no per-sample gradients in memory).

It is a :class:`~dpnotebook.privacy.optimizer.DPOptimizer` whose clipping step
asks the ghost wrapper (:mod:`dpnotebook.grad_sample.ghost`) for every sample's
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

from dpnotebook.grad_sample.ghost import GhostGradSampleModule, ghost_owner
from dpnotebook.privacy.clipping import clip_factors, layer_thresholds
from dpnotebook.privacy.noise import gaussian_noise
from dpnotebook.privacy.optimizer import DPOptimizer, StepStats

__all__ = ["GhostDPOptimizer"]


class GhostDPOptimizer(DPOptimizer):
    """A :class:`DPOptimizer` for models wrapped in ghost mode (same arguments).

    The wrapper is found from the optimizer's parameters, so the model must be
    wrapped (``wrap_model(model, "ghost")``) before the first :meth:`step`.
    """

    def _owners(self) -> list[GhostGradSampleModule]:
        owners = {id(o): o for o in (ghost_owner(p) for p in self.params) if o is not None}
        if not owners:
            raise RuntimeError(
                "GhostDPOptimizer found no ghost-mode model holding its parameters. Fix: wrap the model "
                "with dpnotebook.wrap_model(model, 'ghost') (or make_private(grad_sample_mode='ghost')) "
                "and build the optimizer from that model's parameters."
            )
        return list(owners.values())

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, int] | None:
        """``(clipped sums in self.params order, per-sample norms, number clipped)``, or ``None`` for no samples."""
        params = self.params
        owners = self._owners()
        if len(owners) > 1:
            raise RuntimeError("GhostDPOptimizer's parameters belong to several ghost-mode models; use one optimizer per model.")
        model = owners[0]
        B = model._samples()
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
            factors = clip_factors(layer_sq.sqrt(), layer_thresholds(self.max_grad_norm, len(params)))
            weights = dict(zip(params, factors))
            clipped = int((factors < 1).any(0).sum())
        sums = model.weighted_sums(weights)
        return [sums[p] if p in sums else torch.zeros_like(p) for p in params], norms, clipped

    def virtual_step(self) -> None:
        """Clip the samples of the batches seen since the last step, add them to the running sum."""
        result = self._clip_and_sum()
        if result is not None:
            summed, norms, clipped = result
            self._summed = summed if self._summed is None else [s + r for s, r in zip(self._summed, summed)]
            self._norms.append(norms.detach())
            self._num_clipped += clipped
        self._virtual_steps += 1
        self._release()

    def add_noise(self) -> None:
        """As :meth:`DPOptimizer.add_noise`, in place on the clipped sums (they are this optimizer's own)."""
        self.virtual_step()
        params = self.params
        summed = self._summed or [torch.zeros_like(p) for p in params]
        std = self.noise_multiplier * self.max_grad_norm
        signal_sq, noise_sq = 0.0, 0.0
        for p, s in zip(params, summed):
            noise = gaussian_noise(p.shape, std=std, generator=self.generator, secure=self.secure_mode, dtype=p.dtype, device=p.device)
            signal_sq += float(torch.linalg.vector_norm(s)) ** 2
            noise_sq += float(torch.linalg.vector_norm(noise)) ** 2
            grad = noise.add_(s)
            if self.loss_reduction == "mean":
                grad.div_(self.expected_batch_size)
            p.grad = grad
        norms = torch.cat(self._norms) if self._norms else torch.empty(0)
        self.last_step_stats = StepStats(
            batch_size=int(norms.numel()),
            per_sample_norms=norms,
            fraction_clipped=self._num_clipped / norms.numel() if norms.numel() else 0.0,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            noise_std=std,
            expected_batch_size=self.expected_batch_size,
            clipped_sum_norm=signal_sq**0.5,
            noise_norm=noise_sq**0.5,
            virtual_steps=self._virtual_steps,
        )
        self._reset_accumulation()

    def _release(self) -> None:
        for model in self._owners():
            model.clear_ghost()
        for p in self.params:
            p.grad_sample = None
            p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and the ghost wrapper's records."""
        super().zero_grad(set_to_none=set_to_none)
        for p in self.params:
            model = ghost_owner(p)
            if model is not None:
                model.clear_ghost()
