"""ClippingExplorer: the C line moves, the label changes, the numbers are the library's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnotebook.privacy import clip_and_sum
from dpnotebook.widgets import ClippingExplorer, WidgetValueError, make_toy
from dpnotebook.widgets.clipping import plots
from dpnotebook.widgets.clipping.state import ClippingState


@pytest.fixture
def toy_explorer():
    return ClippingExplorer(toy=make_toy(32, seed=1), backend="static")


def test_slider_moves_line_ball_and_label(toy_explorer, fignums):
    ex = toy_explorer
    label_before = ex.label.get_text()
    ex.controls["max_grad_norm"].value = 0.2
    assert ex.state.max_grad_norm == pytest.approx(0.2)
    assert ex.hist.c_line.get_xdata()[0] == pytest.approx(0.2)
    assert ex.curves.c_line.get_xdata()[0] == pytest.approx(0.2)
    assert ex.arrows.ball.get_radius() == pytest.approx(0.2)
    assert ex.label.get_text() != label_before
    # clipped arrows are no longer than C
    u, v = ex.arrows.clipped.U, ex.arrows.clipped.V
    assert np.hypot(u, v).max() <= 0.2 + 1e-5
    ex.host.png()


def test_fraction_matches_library(toy_explorer):
    ex = toy_explorer
    ex.state.max_grad_norm = 0.5
    expected = clip_and_sum(ex.state.grad_samples, max_grad_norm=0.5).fraction_clipped
    assert f"clipped {100 * expected:.0f}% of samples" in ex.label.get_text()
    assert ex.state.stats().fraction_clipped == expected


def test_bias_goes_away_for_large_c(toy_explorer):
    ex = toy_explorer
    ex.state.max_grad_norm = float(ex.state.norms.max()) * 2
    stats = ex.state.stats()
    assert stats.fraction_clipped == 0
    assert stats.cosine == pytest.approx(1.0, abs=1e-6)
    assert stats.norm_ratio == pytest.approx(1.0, abs=1e-5)


def test_per_layer_on_a_real_model(small_model_batch, fignums):
    model, batch, loss_fn = small_model_batch
    ex = ClippingExplorer(model, batch, loss_fn, backend="static")
    assert ex.arrows is None
    assert not ex.hist.layer_hist.get_visible()
    before = ex.curves.cosine.get_ydata().copy()
    ex.controls["clipping"].value = "per_layer"
    assert ex.state.clipping == "per_layer"
    assert ex.hist.layer_hist.get_visible()
    threshold = ex.state.max_grad_norm / np.sqrt(4)  # 4 parameter tensors
    assert ex.hist.layer_line.get_xdata()[0] == pytest.approx(threshold)
    assert not np.allclose(ex.curves.cosine.get_ydata(), before)
    assert "(per_layer)" in ex.label.get_text()


def test_precomputed_grad_samples():
    g = {"w": torch.tensor([[3.0, 4.0], [0.3, 0.4]])}
    ex = ClippingExplorer(grad_samples=g, max_grad_norm=1.0, backend="static")
    assert ex.arrows is not None  # two numbers per sample: arrows
    assert "clipped 50% of samples" in ex.label.get_text()


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "max_grad_norm=0.0 is invalid"),
        (-1, "max_grad_norm=-1.0 is invalid"),
        (float("inf"), "max_grad_norm=inf is invalid"),
    ],
)
def test_bad_c_refused(toy_explorer, value, text):
    with pytest.raises(WidgetValueError, match=text):
        toy_explorer.state.max_grad_norm = value


def test_bad_mode_refused(toy_explorer):
    with pytest.raises(WidgetValueError, match="clipping='per_sample' is unknown"):
        toy_explorer.state.clipping = "per_sample"


def test_model_without_batch_refused(small_model_batch):
    with pytest.raises(ValueError, match="batch"):
        ClippingExplorer(small_model_batch[0])


def test_callback_error_is_displayed(toy_explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_norm_histogram", boom)
    toy_explorer.controls["max_grad_norm"].value = 0.3
    assert "boom from a plot update" in toy_explorer.error.message
    assert "boom from a plot update" in toy_explorer.error.view.value


def test_image_backend_updates_picture():
    ex = ClippingExplorer(toy=make_toy(16), backend="image")
    first = bytes(ex.host.view.value)
    ex.state.max_grad_norm = 0.05
    assert bytes(ex.host.view.value) != first


def test_state_without_widgets():
    s = ClippingState([torch.ones(4, 3)], max_grad_norm=1.0)
    assert s.stats().fraction_clipped == 1.0
    assert s.curves()["C"].shape == (40,)
