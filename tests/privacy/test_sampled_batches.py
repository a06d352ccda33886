"""Each optimizer step clips the examples of exactly one Poisson batch: no more batches, no more rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

from dpnotebook.privacy import BatchMemoryManager, PrivacyEngine


def _private(collate=None, num_workers: int = 0, K: int = 1):
    data = TensorDataset(torch.randn(60, 3), torch.randn(60, 1))
    model = nn.Linear(3, 1)
    loader = DataLoader(data, batch_size=12, collate_fn=collate, num_workers=num_workers)
    return PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        K=K,
        sampling_generator=torch.Generator().manual_seed(0),
    )


def _backward(model: nn.Module, batch) -> None:
    x, y = batch
    nn.functional.mse_loss(model(x), y).backward()


def test_two_poisson_batches_before_one_step_are_refused() -> None:
    model, optimizer, loader = _private()
    batches = iter(loader)
    _backward(model, next(batches))
    _backward(model, next(batches))
    with pytest.raises(
        RuntimeError, match=r"clipped the samples of 2 Poisson batches .* epsilon would be under-counted"
    ):
        optimizer.step()


def test_one_step_per_batch_and_pieces_of_one_batch_are_fine() -> None:
    model, optimizer, loader = _private()
    for batch in loader:
        optimizer.zero_grad()
        _backward(model, batch)
        optimizer.step()
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=4, optimizer=optimizer) as pieces:
        for piece in pieces:
            optimizer.zero_grad()
            _backward(model, piece)
            optimizer.step()
    assert optimizer.last_step_stats.virtual_steps >= 1


def test_an_evaluation_pass_over_the_loader_is_not_a_training_batch() -> None:
    model, optimizer, loader = _private()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
    for batch in loader:
        _backward(model, batch)
        optimizer.step()
        optimizer.zero_grad()


def _k_rows_per_example(samples: list) -> tuple:
    x, y = default_collate(samples)
    return x.repeat_interleave(4, 0), y.repeat_interleave(4, 0)  # 4 augmented rows, but K was not passed


def test_more_rows_than_examples_are_refused() -> None:
    model, optimizer, loader = _private(collate=_k_rows_per_example)
    batch = next(b for b in loader if len(b[0]) > 0)
    _backward(model, batch)
    examples = len(batch[0]) // 4
    with pytest.raises(
        RuntimeError,
        match=rf"clipped {4 * examples} per-sample gradients, but the Poisson "
        rf"loader sampled {examples} examples .* K was not passed",
    ):
        optimizer.step()


def test_counts_follow_the_batches_with_worker_processes() -> None:
    model, optimizer, loader = _private(num_workers=2)
    for batch in loader:
        optimizer.zero_grad()
        _backward(model, batch)
        optimizer.step()
    assert optimizer.sampled_batches.counts == []
