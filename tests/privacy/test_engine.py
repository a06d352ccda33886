"""PrivacyEngine: make_private trains in every mode, counts steps and samples, checkpoints."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.grad_sample import GradSampleModule
from dpnotebook.privacy import (
    AugmultCollate,
    DPDataLoader,
    DPOptimizer,
    PrivacyEngine,
    evaluate,
    fit,
)


def toy_data(n: int = 200, seed: int = 0) -> TensorDataset:
    """Two Gaussian blobs: class = sign of the first coordinate."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 4, generator=gen) * 0.5
    x[:, 0] += 2 * y - 1
    return TensorDataset(x, y)


def toy_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_make_private_trains_and_counts_steps(mode):
    data = toy_data()
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=20),
        noise_multiplier=0.5,
        max_grad_norm=1.0,
        grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(0),
        sampling_generator=torch.Generator().manual_seed(1),
    )
    assert isinstance(model, GradSampleModule) and isinstance(optimizer, DPOptimizer)
    assert isinstance(loader, DPDataLoader) and loader.sample_rate == 0.1
    assert optimizer.expected_batch_size == pytest.approx(20)
    accuracy_before = evaluate(model, DataLoader(data, batch_size=100))
    losses = fit(model, optimizer, loader, epochs=3, progress=False)
    assert len(engine.accountant) == 30  # every step, empty batches included
    assert engine.accountant.history == [(0.5, 0.1, 30)]
    assert losses[-1] < losses[0]
    assert evaluate(model, DataLoader(data, batch_size=100)) > max(0.8, accuracy_before)
    assert 0 < engine.get_epsilon(1e-5) < float("inf")


def test_accountant_follows_a_changing_noise_multiplier():
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(toy_data(), batch_size=50),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    fit(model, optimizer, loader, epochs=1, progress=False)
    optimizer.noise_multiplier = 2.0
    fit(model, optimizer, loader, epochs=1, progress=False)
    assert engine.accountant.history == [(1.0, 0.25, 4), (2.0, 0.25, 4)]


def test_augmult_counts_samples_not_rows():
    data = toy_data(120)
    K = 4
    loader = DataLoader(data, batch_size=30, collate_fn=AugmultCollate(lambda x: x + 0.01 * torch.randn_like(x), K=K))
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, dp_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        K=K,
        sampling_generator=torch.Generator().manual_seed(1),
    )
    assert engine.sample_rate == 0.25 and optimizer.expected_batch_size == pytest.approx(30)
    x, y = next(iter(dp_loader))
    assert x.shape[0] == len(y) and len(y) % K == 0
    fit(model, optimizer, dp_loader, epochs=1, progress=False)
    assert optimizer.last_step_stats.batch_size * K == optimizer.last_step_stats.batch_size * model.K
    assert engine.accountant.history == [(1.0, 0.25, 4)]


def test_make_private_with_epsilon_spends_at_most_the_target():
    data = toy_data()
    model = toy_model()
    engine = PrivacyEngine()  # PLD
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=40),
        target_epsilon=3.0,
        target_delta=1e-5,
        epochs=2,
        max_grad_norm=1.0,
    )
    fit(model, optimizer, loader, epochs=2, progress=False)
    assert len(engine.accountant) == 10
    assert 2.99 <= engine.get_epsilon(1e-5) <= 3.0


def test_checkpoint_round_trip(tmp_path):
    def setup():
        torch.manual_seed(0)
        engine = PrivacyEngine(accountant="rdp")
        model = toy_model()
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
            data_loader=DataLoader(toy_data(), batch_size=50),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
        return engine, model, opt, loader

    engine, model, opt, loader = setup()
    fit(model, opt, loader, epochs=1, progress=False)
    path = tmp_path / "ckpt.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=opt, checkpoint_dict={"epoch": 1})

    engine2, model2, opt2, _ = setup()
    extra = engine2.load_checkpoint(path=path, module=model2, optimizer=opt2)
    assert extra == {"epoch": 1}
    assert engine2.accountant.history == engine.accountant.history
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    plain = toy_model()  # the saved weights load into the plain model too
    plain.load_state_dict(torch.load(path, weights_only=True)["module_state_dict"])


def test_secure_mode_trains():
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp", secure_mode=True)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(toy_data(), batch_size=50),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    fit(model, optimizer, loader, epochs=1, progress=False)
    assert optimizer.secure_mode and len(engine.accountant) == 4


def test_a_dp_data_loader_keeps_its_sample_rate():
    data = toy_data(100)
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp")
    loader = DPDataLoader(data, sample_rate=0.05, steps=7)
    model, optimizer, dp_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    assert dp_loader.sample_rate == 0.05 and len(dp_loader) == 7 and engine.sample_rate == 0.05
    fit(model, optimizer, dp_loader, epochs=1, progress=False)
    assert engine.accountant.history == [(1.0, 0.05, 7)]


def test_fits_bar_shows_the_loss_and_the_epsilon_spent(capsys):
    data = toy_data()
    model = toy_model()
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=20),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    fit(model, optimizer, loader, epochs=2, privacy_engine=engine, delta=1e-5)
    err = capsys.readouterr().err
    assert "loss=" in err and f"ε={engine.get_epsilon(1e-5):.3g}" in err, err
    with pytest.raises(ValueError, match="privacy_engine is given without delta.*Fix: pass delta="):
        fit(model, optimizer, loader, epochs=1, privacy_engine=engine)
