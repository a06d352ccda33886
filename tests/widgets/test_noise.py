"""NoiseExplorer: noise scales with sigma*C/B, the SNR curve follows, draws are the library's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpnotebook.privacy import gaussian_noise
from dpnotebook.widgets import NoiseExplorer, WidgetValueError, make_toy
from dpnotebook.widgets.noise import plots


@pytest.fixture
def explorer():
    return NoiseExplorer(toy=make_toy(64, seed=2), backend="static")


def test_sigma_scales_the_cloud(explorer, fignums):
    ex = explorer
    ex.controls["noise_multiplier"].value = 0.5
    spread_small = np.std(ex.cloud.draws.get_offsets(), axis=0).sum()
    ex.controls["noise_multiplier"].value = 2.0
    spread_big = np.std(ex.cloud.draws.get_offsets(), axis=0).sum()
    assert spread_big == pytest.approx(4 * spread_small, rel=1e-4)  # same seeded draws, 4x the std
    assert ex.cloud.circle.get_radius() == pytest.approx(2.0 * ex.state.max_grad_norm / ex.state.batch_size)
    assert ex.label.get_text().startswith("sigma = 2")


def test_noise_is_the_librarys(explorer):
    s = explorer.state
    s.set_trait("draws", 1)
    view = s.view()
    clipped_sum = view.clipped_mean * s.batch_size
    noise = gaussian_noise(
        (2,),
        std=s.noise_multiplier * s.max_grad_norm,
        generator=torch.Generator().manual_seed(s.seed),
        dtype=torch.float64,
    ).numpy()
    np.testing.assert_allclose(view.noisy[0], (clipped_sum + noise) / s.batch_size, rtol=1e-6)


def test_batch_size_moves_the_snr_point(explorer):
    explorer.controls["batch_size"].value = 32
    assert explorer.snr.point.get_xdata()[0] == 32
    snr32 = explorer.snr.point.get_ydata()[0]
    explorer.controls["batch_size"].value = 8
    assert explorer.snr.point.get_ydata()[0] < snr32


def test_no_noise_means_infinite_snr(explorer):
    explorer.state.noise_multiplier = 0.0
    assert math.isinf(explorer.state.view().snr)
    assert "not private" in explorer.label.get_text()
    assert explorer.error.message == ""


def test_high_dimensional_projection(small_model_batch):
    model, batch, loss_fn = small_model_batch
    ex = NoiseExplorer(model, batch, loss_fn, batch_size=8, backend="static")
    assert ex.state.dim > 2
    basis = ex.state.basis
    np.testing.assert_allclose(basis @ basis.T, np.eye(2), atol=1e-10)
    assert ex.cloud.draws.get_offsets().shape == (20, 2)


@pytest.mark.parametrize(
    "name, value, text",
    [
        ("noise_multiplier", -1.0, "noise_multiplier=-1.0 is invalid"),
        ("batch_size", 0, "batch_size=0 is invalid"),
        ("batch_size", 65, "batch_size=65 is invalid"),
        ("max_grad_norm", 0.0, "max_grad_norm=0.0 is invalid"),
        ("draws", 0, "draws=0 is invalid"),
    ],
)
def test_bad_values_refused(explorer, name, value, text):
    with pytest.raises(WidgetValueError, match=text):
        setattr(explorer.state, name, value)


def test_callback_error_is_displayed(explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_snr_curve", boom)
    explorer.controls["noise_multiplier"].value = 3.0
    assert "boom from a plot update" in explorer.error.message
