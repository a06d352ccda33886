"""Poisson sampling across ranks: each rank draws its share of one global Poisson batch.

The dataset of ``N`` examples is split into ``world_size`` shards, example ``i``
to rank ``i % world_size``. At every step each rank keeps the examples of its
own shard whose uniform draw is below ``q``, the *global* sample rate. Every
example is therefore in the step's batch with probability ``q``, independently
of all the others, and exactly one rank can take it: the union of the ranks'
batches is a Poisson sample of the whole dataset at rate ``q``, the batch the
accountant's analysis is about. Its expected size is ``q * N`` (what the noisy
sum is divided by); a rank's share may be empty, and that step still counts.

How the uniforms are drawn:

* with a ``generator`` (or PyTorch's default one), every rank draws all ``N``
  uniforms, in the order a single process would, and keeps its shard's: with
  the same seed on every rank the ranks' batches are exactly the single-process
  batch cut in ``world_size`` pieces (seeded runs are reproducible and can be
  compared with one process). Seeds that differ per rank are fine too: each
  example's inclusion still comes from one draw, on its own rank;
* with ``secure_mode``, each rank draws its shard's uniforms from the OS CSPRNG.

>>> import torch
>>> s0 = DistributedPoissonBatchSampler(10, sample_rate=0.5, rank=0, world_size=2,
...                                     generator=torch.Generator().manual_seed(0))
>>> s1 = DistributedPoissonBatchSampler(10, sample_rate=0.5, rank=1, world_size=2,
...                                     generator=torch.Generator().manual_seed(0))
>>> one = PoissonBatchSampler(10, sample_rate=0.5, generator=torch.Generator().manual_seed(0))
>>> [sorted(a + b) == c for a, b, c in zip(s0, s1, one)]
[True, True]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import torch
import torch.distributed as dist

from dpnotebook.privacy._data import DPDataLoader, PoissonBatchSampler
from dpnotebook.privacy.noise import secure_uniform

__all__ = ["DistributedPoissonBatchSampler", "DistributedDPDataLoader", "rank_and_world"]


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the ones given, else the default process group's.

    Raises:
        RuntimeError: neither given and ``torch.distributed`` is not initialised.
        ValueError: a rank outside ``0 .. world_size - 1``.

    >>> rank_and_world(1, 4)
    (1, 4)
    """
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed sampling needs torch.distributed initialised (rank and world size). Fix: call "
                "torch.distributed.init_process_group(...) first (torchrun sets the environment for it), "
                "or pass rank= and world_size=."
            )
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid: pass the number of processes, an int >= 1.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid: pass an int in 0 .. {world_size - 1} (world_size={world_size}).")
    return rank, world_size


class DistributedPoissonBatchSampler(PoissonBatchSampler):
    """This rank's share of ``steps`` global Poisson batches (see the module docstring).

    Args:
        num_samples: ``N``, the size of the whole dataset (all ranks).
        sample_rate: the global ``q``.
        steps: batches per epoch, the same on every rank (default ``round(1 / q)``).
        generator: a ``torch.Generator``; seed it alike on every rank to reproduce the
            single-process batches.
        secure_mode: draw from the OS CSPRNG (no ``generator`` then).
        rank, world_size: default: the default process group's.

    Attributes:
        shard: the dataset indices this rank may sample (``rank, rank + world_size, ...``).
    """

    def __init__(
        self,
        num_samples: int,
        *,
        sample_rate: float,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(
            num_samples, sample_rate=sample_rate, steps=steps, generator=generator, secure_mode=secure_mode
        )
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.shard = torch.arange(self.rank, self.num_samples, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        self.drawn.clear()
        for _ in range(self.steps):
            if self.secure_mode:
                kept = self.shard[secure_uniform(len(self.shard)) < self.sample_rate]
            else:  # all N draws, as one process makes them (float64: see PoissonBatchSampler)
                uniform = torch.rand(self.num_samples, generator=self.generator, dtype=torch.float64)
                kept = self.shard[uniform[self.shard] < self.sample_rate]
            indices = kept.tolist()
            self.drawn.append(len(indices))
            yield indices


class DistributedDPDataLoader(DPDataLoader):
    """A :class:`~dpnotebook.privacy.DPDataLoader` that yields this rank's share of each global Poisson batch.

    Same arguments as :class:`~dpnotebook.privacy.DPDataLoader` (``dataset`` is the whole dataset, on
    every rank). ``sample_rate`` and ``expected_batch_size`` (``q * N``) are the
    global ones, which the accountant and the optimizer need; ``len`` is the number
    of global steps per epoch, the same on every rank.

    Attributes:
        rank, world_size: this process and the number of processes.
        local_expected_batch_size: ``q * (size of this rank's shard)``.
    """

    batch_sampler_class = DistributedPoissonBatchSampler

    def __init__(self, *args, **kwargs) -> None:  # *args, **kwargs: DPDataLoader's
        super().__init__(*args, **kwargs)
        # DPDataLoader built its batch sampler from batch_sampler_class
        sampler = cast(DistributedPoissonBatchSampler, self.batch_sampler)
        self.rank, self.world_size = sampler.rank, sampler.world_size
        self.local_expected_batch_size = self.sample_rate * len(sampler.shard)


DPDataLoader.distributed_class = DistributedDPDataLoader  # what DPDataLoader.from_data_loader(distributed=True) builds
