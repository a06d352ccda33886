"""Warnings where the user's choice weakens what the epsilon or the noise means."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpnotebook.privacy._mechanisms as noise
from dpnotebook.errors import PrivacyWarning
from dpnotebook.grad_sample import GradSampleModule
from dpnotebook.privacy import DPOptimizer, PrivacyEngine


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=8, shuffle=True)


def test_poisson_sampling_false_warns_that_epsilon_is_not_a_bound() -> None:
    model = nn.Linear(3, 1)
    with pytest.warns(PrivacyWarning, match=r"poisson_sampling=False.*not a bound for this run"):
        PrivacyEngine(secure_mode=False).make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=_loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )


def _step(optimizer: DPOptimizer, model: nn.Module) -> None:
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noise, "_WARNED_INSECURE", [False])


def test_unchosen_insecure_noise_warns_once(fresh_warning: None) -> None:
    model = GradSampleModule(nn.Linear(3, 1))
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4
    )
    with pytest.warns(PrivacyWarning, match="not cryptographically secure"):
        _step(opt, model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(opt, model)  # once per process


@pytest.mark.parametrize("choice", [{"secure_mode": False}, {"secure_mode": True}, {"generator": "seeded"}])
def test_a_choice_silences_the_insecure_noise_warning(fresh_warning: None, choice: dict) -> None:
    if choice.get("generator") == "seeded":
        choice = {"generator": torch.Generator().manual_seed(0)}
    model = GradSampleModule(nn.Linear(3, 1))
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=4,
        **choice,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(opt, model)


def test_the_engine_passes_its_choice_on(fresh_warning: None) -> None:
    for secure_mode, warns in ((None, True), (False, False)):
        noise._WARNED_INSECURE[0] = False
        model = nn.Linear(3, 1)
        engine = PrivacyEngine(secure_mode=secure_mode)
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=_loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in loader:
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        assert any(w.category is PrivacyWarning for w in caught) == warns


def test_a_sigma_that_drowns_the_signal_is_said() -> None:
    """A budget met only by sigma > B (sigma in the thousands for B = 8) warns that every update is mostly noise."""
    model = nn.Linear(3, 1)
    with pytest.warns(PrivacyWarning, match=r"noise_multiplier=\S+ with an expected batch of 8 samples.*mostly noise"):
        _, optimizer, _ = PrivacyEngine(secure_mode=False).make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=8),
            target_epsilon=1e-3,
            target_delta=1e-5,
            epochs=50,
            max_grad_norm=1.0,
        )
    assert optimizer.noise_multiplier > 8


def test_a_usual_sigma_does_not_warn() -> None:
    model = nn.Linear(3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrivacyEngine(secure_mode=False).make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=8),
            noise_multiplier=8.0,  # sigma = B: the boundary, still said nothing
            max_grad_norm=1.0,
        )


def test_an_unreachable_budget_says_what_to_change() -> None:
    from dpnotebook.privacy import get_noise_multiplier

    with pytest.raises(ValueError, match=r"cannot be reached.*Fix: use more data.*fewer epochs.*larger target_epsilon"):
        get_noise_multiplier(target_epsilon=1e-9, target_delta=1e-10, sample_rate=1.0, steps=10_000)
