"""Unseeded ranks never sample with the random numbers of the noise (one process, ranks simulated).

Before, an unseeded DistributedPoissonBatchSampler drew from the global RNG. Ranks seeded alike
(``torch.manual_seed(0)`` in every process, the usual script) then consumed one stream each: rank 0
draws a batch, then the step's noise, while rank 1 draws batches only, so rank 1's step-2 batch was
drawn from the numbers rank 0's step-1 noise had used: its examples' inclusion was a function of a
noise the released update reveals, and the shares no longer made up one Poisson batch.
"""

from __future__ import annotations

import torch

from dpnotebook.privacy._distributed import DistributedPoissonBatchSampler


def _shares(rank: int, world_size: int, *, noise: bool) -> list[list[int]]:
    torch.manual_seed(0)  # every process seeded alike
    sampler = DistributedPoissonBatchSampler(40, sample_rate=0.3, steps=6, rank=rank, world_size=world_size)
    batches = []
    for batch in sampler:
        batches.append(batch)
        if noise:  # rank 0 draws each step's noise from the global RNG (no noise_generator)
            torch.randn(1000)
    return batches


def test_unseeded_ranks_seeded_alike_share_one_poisson_batch_and_not_the_noise() -> None:
    whole = _shares(0, 1, noise=True)  # one process, drawing noise after each batch
    rank0, rank1 = _shares(0, 2, noise=True), _shares(1, 2, noise=False)
    assert [sorted(a + b) for a, b in zip(rank0, rank1, strict=True)] == whole
    assert all(i % 2 == 1 for batch in rank1 for i in batch) and sum(map(len, rank1)) > 0
