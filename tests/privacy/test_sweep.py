"""Privacy-utility sweeps: budgets kept, seeds reproducible, step statistics as the theory says."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from dpnotebook.privacy import (
    RunSetting,
    get_noise_multiplier,
    steps_for_epochs,
    steps_per_epoch,
    summarise,
    sweep,
    train_run,
)


@pytest.fixture(scope="module")
def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def test_private_run_keeps_its_budget(data: TensorDataset) -> None:
    setting = RunSetting(epsilon=2.0, batch_size=30, epochs=3, num_classes=2)
    result = train_run(setting, data, data, seed=0)
    steps = steps_for_epochs(3, steps_per_epoch(30 / 300))
    assert result.steps == steps
    assert result.noise_multiplier == get_noise_multiplier(
        target_epsilon=2.0, target_delta=1e-5, sample_rate=0.1, steps=steps
    )
    assert 1.9 < result.epsilon <= 2.0


def test_noise_and_signal_norms(data: TensorDataset) -> None:
    """The noise norm is about sigma*C*sqrt(d); the clipped sum is at most C per sample."""
    setting = RunSetting(noise_multiplier=3.0, max_grad_norm=0.5, batch_size=30, epochs=2, num_classes=2, hidden=64)
    result = train_run(setting, data, data)
    d = 6 * 64 + 64 + 64 * 2 + 2
    assert result.trained_parameters == d
    assert result.noise_norm == pytest.approx(3.0 * 0.5 * math.sqrt(d), rel=0.1)
    assert 0 < result.clipped_sum_norm <= 0.5 * 300


def test_non_private_and_seeds(data: TensorDataset) -> None:
    before = torch.get_rng_state()
    plain = train_run(RunSetting(batch_size=30, epochs=3, num_classes=2), data, data, seed=0)
    assert torch.equal(before, torch.get_rng_state()), "a run must not move the global generator"
    assert plain.epsilon == math.inf and plain.noise_multiplier == 0.0 and plain.accuracy > 0.8
    setting = RunSetting(noise_multiplier=1.0, batch_size=30, epochs=1, num_classes=2)
    again = [train_run(setting, data, data, seed=s).accuracy for s in (0, 0, 1)]
    a, b, _ = [train_run(setting, data, data, seed=s).noise_norm for s in (0, 0, 1)]
    assert again[0] == again[1] and a == b


def test_sweep_and_summary(data: TensorDataset) -> None:
    settings = [RunSetting(epsilon=e, batch_size=30, epochs=1, num_classes=2) for e in (1.0, 8.0)]
    results = sweep(settings, data, data, seeds=[0, 1, 2])
    summary = summarise(results, by="epsilon")
    assert [s.key for s in summary] == [1.0, 8.0] and all(s.n == 3 for s in summary)
    accs = torch.tensor([r.accuracy for r in results[:3]], dtype=torch.float64)
    assert summary[0].mean == pytest.approx(float(accs.mean())) and summary[0].std == pytest.approx(float(accs.std()))
    assert summary[0].noise_multiplier > summary[1].noise_multiplier
    by_fn = summarise(results, by=lambda s: s.epsilon > 2)
    assert [s.key for s in by_fn] == [False, True]


def test_bad_settings(data: TensorDataset) -> None:
    with pytest.raises(ValueError, match="give one of them"):
        RunSetting(epsilon=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="batch_size=0"):
        RunSetting(batch_size=0)
    with pytest.raises(ValueError, match="batch_size=400 is invalid for 300"):
        train_run(RunSetting(batch_size=400, num_classes=2), data, data)


def test_sweep_shows_progress_only_when_asked_or_on_a_terminal(data: TensorDataset, capsys, monkeypatch) -> None:
    """A bar counts the runs; by default (stderr not a terminal, as in a notebook's kernel) there is none."""
    settings = [RunSetting(epsilon=4.0, batch_size=30, epochs=1, num_classes=2)]
    sweep(settings, data, data, seeds=[0, 1])
    assert capsys.readouterr().err == ""
    sweep(settings, data, data, seeds=[0, 1], progress=True)
    err = capsys.readouterr().err
    assert "sweep:" in err and "/2 [" in err and "run/s" in err, err
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    sweep(settings, data, data, seeds=[0])
    assert "/1 [" in capsys.readouterr().err
    sweep(settings, data, data, seeds=[0], progress=False)
    assert capsys.readouterr().err == ""


def test_device_argument_moves_the_run(data: TensorDataset) -> None:
    setting = RunSetting(epsilon=2.0, batch_size=30, epochs=2, num_classes=2)
    default = train_run(setting, data, data, seed=3)  # on the device the model is made on
    moved = train_run(setting, data, data, seed=3, device=data.tensors[0].device.type)
    assert (moved.accuracy, moved.clipped_sum_norm, moved.noise_norm) == (
        default.accuracy,
        default.clipped_sum_norm,
        default.noise_norm,
    )
    with pytest.raises((NotImplementedError, RuntimeError)):  # "meta" holds no data: the run really goes there
        train_run(setting, data, data, seed=3, device="meta", model_fn=lambda s, d: torch.nn.Linear(d, 2))
