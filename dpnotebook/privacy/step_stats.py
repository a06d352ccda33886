"""``StepStats``: what one DP-SGD step did, for printing and plotting.

:class:`~dpnotebook.privacy.DPOptimizer` fills one after every
step (``optimizer.last_step_stats``); the training monitor and the clipping
widgets read it. The per-sample norms are computed from the data without noise,
so they are not private: show them to a student, never publish them.

>>> import torch
>>> stats = StepStats.of_batch([torch.tensor([0.5, 2.0]), torch.tensor([3.0])], num_clipped=2,
...                            noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=3.0,
...                            clipped_sum_norm=2.0, noise_norm=4.0, virtual_steps=2)
>>> stats.batch_size, round(stats.fraction_clipped, 3), stats.noise_std
(3, 0.667, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["StepStats", "total_norm", "total_norms"]


@dataclass
class StepStats:
    """What the last :meth:`DPOptimizer.step` did, for printing and plotting.

    Attributes:
        batch_size: the number of samples in the logical batch (0 for an empty one).
        per_sample_norms: each sample's gradient norm before clipping, shape ``[batch_size]``.
        fraction_clipped: the fraction of samples whose gradient was scaled down.
        noise_multiplier: sigma.
        max_grad_norm: C.
        noise_std: ``sigma * C``, the std of the noise added to the clipped sum.
        expected_batch_size: what the noisy sum was divided by (for ``"mean"``).
        clipped_sum_norm: the norm of the clipped sum (the signal), over all parameters.
        noise_norm: the norm of the noise that was added to it.
        virtual_steps: how many physical pieces made up the logical batch.
    """

    batch_size: int
    per_sample_norms: Tensor
    fraction_clipped: float
    noise_multiplier: float
    max_grad_norm: float
    noise_std: float
    expected_batch_size: float
    clipped_sum_norm: float
    noise_norm: float
    virtual_steps: int

    @classmethod
    def of_batch(
        cls,
        norms: list[Tensor],
        *,
        num_clipped: int,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        clipped_sum_norm: float,
        noise_norm: float,
        virtual_steps: int,
    ) -> StepStats:
        """The statistics of a logical batch from the per-sample norms of its physical pieces.

        Args:
            norms: each piece's per-sample norms (before clipping); none for an empty batch.
            num_clipped: how many samples were scaled down.
            noise_multiplier, max_grad_norm, expected_batch_size: the optimizer's settings.
            clipped_sum_norm, noise_norm: the norms of the clipped sum and of the noise.
            virtual_steps: the number of pieces.
        """
        per_sample = norms[0] if len(norms) == 1 else torch.cat(norms) if norms else torch.empty(0)
        n = int(per_sample.numel())
        return cls(
            batch_size=n,
            per_sample_norms=per_sample,
            fraction_clipped=num_clipped / n if n else 0.0,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            noise_std=noise_multiplier * max_grad_norm,
            expected_batch_size=expected_batch_size,
            clipped_sum_norm=clipped_sum_norm,
            noise_norm=noise_norm,
            virtual_steps=virtual_steps,
        )


def total_norms(first: list[Tensor], second: list[Tensor]) -> tuple[float, float]:
    """:func:`total_norm` of two lists at once: one ``_foreach_norm`` (one kernel on a GPU) and one synchronisation.

    >>> total_norms([torch.tensor([3.0]), torch.tensor([[4.0]])], [torch.tensor([1.0])]), total_norms([], [])
    ((5.0, 1.0), (0.0, 0.0))
    """
    norms = _tensor_norms([*first, *second])
    return math.sqrt(math.fsum(n * n for n in norms[: len(first)])), math.sqrt(
        math.fsum(n * n for n in norms[len(first) :])
    )


def _tensor_norms(tensors: list[Tensor]) -> list[float]:
    """Each tensor's L2 norm, on the host: one ``_foreach_norm``, one ``stack``, one synchronisation."""
    if not tensors:
        return []
    return torch.stack(torch._foreach_norm([t.detach() for t in tensors])).tolist()


def total_norm(tensors: list[Tensor]) -> float:
    """The L2 norm of all ``tensors`` taken together (no squared copies, one synchronisation).

    >>> total_norm([torch.tensor([3.0]), torch.tensor([[4.0]])]), total_norm([])
    (5.0, 0.0)
    """
    return math.sqrt(math.fsum(n * n for n in _tensor_norms(tensors)))
