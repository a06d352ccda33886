"""Sigma is calibrated for exactly the steps the returned loader runs, so a full run spends at most the target."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import DPDataLoader, PrivacyEngine, get_noise_multiplier, steps_for_epochs


def _data(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3), torch.randn(n, 1))


LOADERS = {
    "poisson q=0.6": lambda: DPDataLoader(_data(40), sample_rate=0.6, generator=torch.Generator().manual_seed(0)),
    "plain, 93 batches": lambda: DataLoader(_data(93), batch_size=1),
    "plain, 7 batches": lambda: DataLoader(_data(20), batch_size=3),
}


@pytest.mark.parametrize("name", LOADERS)
@pytest.mark.parametrize("target,epochs", [(2.0, 1), (8.0, 1), (3.0, 2)])
def test_training_the_returned_loader_spends_at_most_the_target(name: str, target: float, epochs: int) -> None:
    model = nn.Linear(3, 1)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=LOADERS[name](),
        target_epsilon=target,
        target_delta=1e-3,
        epochs=epochs,
        max_grad_norm=1.0,
    )
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    assert len(engine.accountant) == epochs * len(loader)
    assert engine.get_epsilon(1e-3) <= target


def test_calibration_counts_the_loader_steps() -> None:
    """The reviewer's case: q = 0.6 ran 2 steps per epoch while int(1 / 0.6) = 1 step was calibrated (2.77 > 2)."""
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, epochs=1)
    one_step = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, steps=1)
    two_steps = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, steps=2)
    assert sigma == two_steps > one_step
    assert get_noise_multiplier(
        target_epsilon=8.0, target_delta=1e-5, sample_rate=1 / 93, epochs=1, steps_per_epoch=93
    ) == get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=1 / 93, steps=93)


def test_steps_per_epoch_goes_with_epochs_only() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch=5 goes with epochs="):
        get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.1, steps=10, steps_per_epoch=5)
    assert steps_for_epochs(30, 14) == 420
