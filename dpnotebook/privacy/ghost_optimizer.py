"""``GhostDPOptimizer``: DP-SGD with ghost clipping (no per-sample gradients in memory).

It is a :class:`~dpnotebook.privacy.optimizer.DPOptimizer` whose clipping step
asks the ghost wrapper (:mod:`dpnotebook.grad_sample.ghost`) for every sample's
gradient norm and then for the clip-factor-weighted sum of the gradients,
instead of reading ``p.grad_sample``. Noise, scaling, virtual steps, the
statistics and the step hooks are the base class's; a large model's noise is
drawn on several threads (:func:`draw_noise`).

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

import functools
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.ghost import GhostGradSampleModule, ghost_owner
from dpnotebook.privacy.clipping import clip_factors, layer_thresholds
from dpnotebook.privacy.noise import gaussian_noise
from dpnotebook.privacy.optimizer import DPOptimizer, StepStats

__all__ = ["GhostDPOptimizer", "draw_noise"]

#: A CPU model with at least this many parameters draws its noise on several threads.
PARALLEL_NOISE_MIN = 2**17


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpnotebook-noise")


def draw_noise(params: list[nn.Parameter], std: float, generator: torch.Generator | None, secure: bool) -> list[Tensor]:
    """``N(0, std^2)`` noise shaped like each parameter.

    PyTorch draws normal numbers on one CPU core; for a large model that is a
    good part of a DP-SGD step. So a large CPU model's noise is drawn in
    ``torch.get_num_threads()`` pieces at once, each from its own generator
    seeded from ``generator`` (or the global one): a seeded run still repeats
    exactly. Secure noise, GPUs and small models take the plain path
    (:func:`~dpnotebook.privacy.noise.gaussian_noise`).

    >>> import torch
    >>> params = [torch.nn.Parameter(torch.zeros(2, 3))]
    >>> draw_noise(params, 1.0, torch.Generator().manual_seed(0), secure=False)[0].shape
    torch.Size([2, 3])
    """
    total = sum(p.numel() for p in params)
    workers = torch.get_num_threads()
    plain = secure or std == 0 or total < PARALLEL_NOISE_MIN or workers < 2
    if plain or any(p.device.type != "cpu" or p.dtype != params[0].dtype for p in params):
        return [
            gaussian_noise(p.shape, std=std, generator=generator, secure=secure, dtype=p.dtype, device=p.device)
            for p in params
        ]
    flat = torch.empty(total, dtype=params[0].dtype)
    seeds = torch.randint(0, 2**62, (workers,), generator=generator).tolist()
    pieces = flat.tensor_split(workers)
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    jobs = [_pool(workers).submit(t.normal_, 0.0, std, generator=g) for t, g in zip(pieces[1:], gens[1:])]
    pieces[0].normal_(0.0, std, generator=gens[0])
    for job in jobs:
        job.result()
    return [t.view_as(p) for t, p in zip(flat.split([p.numel() for p in params]), params)]


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
        """As :meth:`DPOptimizer.add_noise`, with the noise of :func:`draw_noise` (the clipped sums are added to it in place)."""
        self.virtual_step()
        params = self.params
        summed = self._summed or [torch.zeros_like(p) for p in params]
        std = self.noise_multiplier * self.max_grad_norm
        signal_sq, noise_sq = 0.0, 0.0
        for p, s, noise in zip(params, summed, draw_noise(params, std, self.generator, self.secure_mode)):
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
