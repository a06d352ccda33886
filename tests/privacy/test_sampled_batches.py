"""Each optimizer step clips the examples of exactly one Poisson batch: no more batches, no more rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

from dpnotebook.privacy import BatchMemoryManager, PrivacyEngine


def _private(collate=None, num_workers: int = 0, K: int = 1):
    # the data stays on the CPU, as for worker processes it must (a forked worker cannot use CUDA)
    data = TensorDataset(torch.randn(60, 3, device="cpu"), torch.randn(60, 1, device="cpu"))
    model = nn.Linear(3, 1)
    loader = DataLoader(data, batch_size=12, collate_fn=collate, num_workers=num_workers)
    return PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        K=K,
        sampling_generator=torch.Generator().manual_seed(1),
    )


def _backward(model: nn.Module, batch) -> None:
    x, y = (t.to(next(model.parameters()).device) for t in batch)
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
            model(x.to(next(model.parameters()).device))
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


# -- #28.4: every clipped sum comes from a batch the DP loader drew for that logical step ------------


def _repro_original_loader_loop():
    """Issue #28.4's run: N = 20, sigma = 1, RDP; make_private, then a loop over the ORIGINAL loader."""
    data = TensorDataset(torch.randn(20, 3), torch.randn(20, 1))
    original = DataLoader(data, batch_size=1)
    model = nn.Linear(3, 1)
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, _ = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=original,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    return engine, model, optimizer, original


def test_a_loop_over_the_original_loader_is_refused_at_its_first_step() -> None:
    # before: no warning, 20 steps accounted as Poisson at q = 1/20 (epsilon 2.48 at delta 1e-5) while
    # each example sat in one known step (a Gaussian mechanism at sigma 1: epsilon 4.38)
    engine, model, optimizer, original = _repro_original_loader_loop()
    x, y = next(iter(original))
    nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match=r"handed out no batch since the last step.* original DataLoader"):
        optimizer.step()
    assert len(engine.accountant) == 0  # refused before the accountant counted it


def test_batch_memory_manager_over_the_original_loader_is_refused() -> None:
    _, model, optimizer, original = _repro_original_loader_loop()
    with BatchMemoryManager(data_loader=original, max_physical_batch_size=4, optimizer=optimizer) as pieces:
        piece = next(iter(pieces))
        _backward(model, piece)
        with pytest.raises(RuntimeError, match="handed out no batch since the last step"):
            optimizer.step()


def test_two_steps_for_one_batch_are_refused() -> None:
    model, optimizer, loader = _private()
    batch = next(iter(loader))
    _backward(model, batch)
    optimizer.step()
    optimizer.zero_grad()
    _backward(model, batch)
    with pytest.raises(RuntimeError, match="optimizer.step\\(\\) called twice for one batch"):
        optimizer.step()


def test_a_noise_only_step_needs_a_draw_too() -> None:
    _, _, optimizer, _ = _repro_original_loader_loop()
    with pytest.raises(RuntimeError, match="clipped 0 per-sample gradients, but its DPDataLoader handed out no batch"):
        optimizer.step()


def test_empty_poisson_batches_and_augmult_batches_are_steps_of_their_draw() -> None:
    from dpnotebook.privacy import AugmultCollate

    data = TensorDataset(torch.randn(30, 3), torch.randn(30, 1))
    model = nn.Linear(3, 1)
    model, optimizer, loader = PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=1, collate_fn=AugmultCollate(lambda x: x, K=3)),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        K=3,
        sampling_generator=torch.Generator().manual_seed(1),
    )
    sizes = []
    with pytest.warns(UserWarning, match="empty batch"):
        for batch in loader:
            sizes.append(len(batch[0]))
            optimizer.zero_grad()
            _backward(model, batch)
            optimizer.step()
    assert 0 in sizes and any(s > 0 for s in sizes) and all(s % 3 == 0 for s in sizes)


def test_a_standalone_optimizer_is_not_tied_to_a_loader() -> None:
    import dpnotebook
    from dpnotebook.privacy import DPOptimizer

    model = dpnotebook.wrap_model(nn.Linear(3, 1), "hooks")
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=4,
        secure_mode=False,
    )
    for _ in range(2):
        _backward(model, (torch.randn(4, 3), torch.randn(4, 1)))
        optimizer.step()
        optimizer.zero_grad()
    assert not optimizer.sampled_batches.tied


# -- provenance, not counts: the loader marks the tensors of each batch it hands out ------------------


def _full_batches(mode: str = "hooks"):
    """q = 1: every Poisson batch holds all 12 examples, so every count agrees with every other."""
    data = TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
    model = nn.Linear(3, 1)
    return PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        grad_sample_mode=mode,
    )


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functorch", "ew"])
def test_a_batch_drawn_for_an_earlier_step_is_refused_although_the_counts_agree(mode: str) -> None:
    model, optimizer, loader = _full_batches(mode)  # one batch per pass: each iter() is a new pass
    old = next(iter(loader))
    _backward(model, old)
    optimizer.step()
    optimizer.zero_grad()
    next(iter(loader))  # drawn, 12 examples, as the old one
    _backward(model, old)
    with pytest.raises(RuntimeError, match="did not hand out since the last step .* drawn for an earlier step"):
        optimizer.step()


def test_a_batch_of_another_dp_loader_is_refused_although_the_counts_agree() -> None:
    model, optimizer, loader = _full_batches()
    _, _, other = _full_batches()
    for _, foreign in zip(loader, other, strict=True):
        _backward(model, foreign)
        with pytest.raises(RuntimeError, match="or by another loader"):
            optimizer.step()
        break


def test_an_earlier_batch_of_this_step_is_refused_although_the_counts_agree() -> None:
    model, optimizer, loader = _full_batches()
    first = next(iter(loader))
    next(iter(loader))
    _backward(model, first)
    with pytest.raises(RuntimeError, match="has handed out 1 more since: a step must train on the last batch"):
        optimizer.step()


def test_gradients_dropped_by_zero_grad_or_never_computed_do_not_count() -> None:
    model, optimizer, loader = _full_batches()
    for i in range(6):
        batch = x, y = next(iter(loader))
        loss = nn.functional.mse_loss(model(x), y)  # a forward pass with no backward: not trained on
        if i % 2:
            optimizer.zero_grad()
            loss.backward()
            optimizer.zero_grad()  # ... and a backward whose gradients are dropped
            continue
        optimizer.zero_grad()
        _backward(model, batch)
        optimizer.step()


def test_a_sum_dropped_by_zero_grad_does_not_count_either() -> None:
    """Opacus-style: clip_and_accumulate() then zero_grad() drops the sum, and its rows with it."""
    model, optimizer, loader = _full_batches()
    dropped = next(iter(loader))
    _backward(model, dropped)
    optimizer.clip_and_accumulate()
    optimizer.zero_grad()  # the sum is gone: those rows are no longer in any step
    batch = next(iter(loader))
    _backward(model, batch)
    optimizer.step()  # one batch in the step: not refused as two
    assert optimizer.last_step_stats.batch_size == 12


def test_pieces_of_the_batch_carry_its_mark() -> None:
    model, optimizer, loader = _full_batches()
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=5, optimizer=optimizer) as pieces:
        for piece in pieces:
            optimizer.zero_grad()
            _backward(model, piece)
            optimizer.step()
    assert optimizer.last_step_stats.virtual_steps == 3


def test_the_model_can_still_be_saved_whole() -> None:
    import io

    model, optimizer, loader = _full_batches("hooks")
    for batch in loader:
        _backward(model, batch)
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the forward hook that records draws pickles with it
    assert buffer.tell() > 0
