"""What distributed training refuses, with the reason and the fix (one process, no launch needed)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader

from dpnotebook import wrap_model
from dpnotebook.privacy import DPDDP, DistributedDPOptimizer, PrivacyEngine
from dpnotebook.privacy._distributed import (
    DistributedDPDataLoader,
    DistributedPoissonBatchSampler,
    rank_and_world,
)
from dpnotebook.privacy._launch import free_port
from tests.distributed import workers


def test_without_a_process_group_the_error_says_how_to_start_one() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DPDDP(workers.mlp())
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedPoissonBatchSampler(10, sample_rate=0.5)


@pytest.mark.parametrize(
    "rank, world, name", [(2, 2, "rank"), (-1, 2, "rank"), (0, 0, "world_size"), (True, 2, "rank")]
)
def test_bad_rank_or_world_size_is_named(rank, world, name) -> None:
    with pytest.raises(ValueError, match=f"{name}="):
        rank_and_world(rank, world)


@pytest.fixture
def group_of_one():
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    yield
    dist.destroy_process_group()


def _make_private(module, loader, **kwargs):
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    return engine.make_private(
        module=module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=loader,
        max_grad_norm=1.0,
        **{"noise_multiplier": 0.0, **kwargs},
    )


def test_refusals_in_a_group(group_of_one) -> None:
    loader = DataLoader(workers.dataset(), batch_size=6)
    with pytest.raises(ValueError, match="poisson_sampling=False with a distributed model"):
        _make_private(DPDDP(workers.mlp()), loader, poisson_sampling=False)
    shared = DistributedDPDataLoader(workers.dataset(), sample_rate=0.25)
    with pytest.raises(ValueError, match="module is not distributed"):
        _make_private(workers.mlp(), shared)
    with pytest.raises(ValueError, match="grad-sample wrapper around DifferentiallyPrivate"):
        _make_private(wrap_model(DPDDP(workers.mlp())), loader)
    shared_generator = torch.Generator().manual_seed(0)  # rank 0 would sample later batches with its noise's numbers
    with pytest.raises(ValueError, match="noise generator is the generator that draws the batches.*on another rank"):
        _make_private(
            DPDDP(workers.mlp()),
            loader,
            noise_multiplier=1.0,
            noise_generator=shared_generator,
            sampling_generator=shared_generator,
        )


def test_a_rank_other_than_the_process_groups_is_refused(group_of_one) -> None:
    # e.g. LOCAL_RANK passed as the rank on a second machine: two processes would sample one shard,
    # each of its examples then in a step twice (2 C), the other shard never
    with pytest.raises(ValueError, match=r"rank=1, world_size=2 are not this process's: rank 0 of 1"):
        DistributedPoissonBatchSampler(10, sample_rate=0.5, rank=1, world_size=2)
    assert DistributedPoissonBatchSampler(10, sample_rate=0.5, rank=0, world_size=1).world_size == 1


def test_a_group_of_one_is_one_process(group_of_one) -> None:
    model, optimizer, loader = _make_private(
        DPDDP(workers.mlp()),
        DataLoader(workers.dataset(), batch_size=6),
        sampling_generator=torch.Generator().manual_seed(0),
    )
    assert isinstance(optimizer, DistributedDPOptimizer) and isinstance(loader, DistributedDPDataLoader)
    plain, plain_optimizer, plain_loader = _make_private(
        workers.mlp(), DataLoader(workers.dataset(), batch_size=6), sampling_generator=torch.Generator().manual_seed(0)
    )
    for m, opt, data in ((model, optimizer, loader), (plain, plain_optimizer, plain_loader)):
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters(), strict=True))
    assert loader.expected_batch_size == loader.local_expected_batch_size == 6.0


def test_from_data_loader_distributed_is_the_distributed_loader(group_of_one) -> None:
    from dpnotebook.privacy import DPDataLoader

    loader = DPDataLoader.from_data_loader(DataLoader(workers.dataset(), batch_size=6), distributed=True)
    assert type(loader) is DistributedDPDataLoader
    assert (loader.sample_rate, loader.expected_batch_size, len(loader), loader.world_size) == (0.25, 6.0, 4, 1)
