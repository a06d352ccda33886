"""GradientExplorer: layers, samples, modes that agree, failing modes shown."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnotebook.modes import available_modes
from dpnotebook.widgets import GradientExplorer, WidgetValueError
from dpnotebook.widgets.gradient import plots


@pytest.fixture
def explorer(small_model_batch):
    model, batch, loss_fn = small_model_batch
    return GradientExplorer(model, batch, loss_fn, backend="static")


def test_modes_agree_and_failures_are_listed(explorer):
    s = explorer.state
    assert set(s.modes) == set(available_modes())
    assert set(s.grads) | set(s.norms_only) | set(s.errors) == set(s.modes)
    for mode, diff in s.differences.items():
        assert diff < 1e-5, mode
    for mode, error in s.errors.items():  # e.g. "ew" while it is being written
        assert error in explorer.table.value.replace("&#x27;", "'"), mode
    assert "reference" in explorer.table.value


def test_layer_and_sample_update_the_pictures(explorer, fignums):
    ex = explorer
    ex.controls["layer"].value = "0.weight"
    assert ex.gradient.image.get_array().shape == (3 * 4 - 1, 3)  # 3x1 filters of 3x3
    ex.controls["layer"].value = "3.weight"
    assert ex.gradient.image.get_array().shape == (4, 48)
    ex.controls["sample"].value = 5
    expected = ex.state.grads[ex.state.mode]["3.weight"][5].cpu().numpy()
    np.testing.assert_allclose(ex.gradient.image.get_array(), expected, rtol=1e-6)
    assert ex.norms.sample_line.get_xdata()[0] == 5
    assert ex.norms.lines[2].get_linewidth() > ex.norms.lines[0].get_linewidth()
    assert "3.weight" in ex.gradient.ax.get_title()


def test_switching_mode(explorer):
    other = [m for m in explorer.state.grads if m != explorer.state.reference]
    if not other:
        pytest.skip("only one mode works")
    explorer.controls["mode"].value = other[0]
    assert explorer.state.mode == other[0]
    assert f"mode {other[0]}" in explorer.gradient.ax.get_title()


def test_failing_mode_is_refused_with_its_error(small_model_batch):
    model, batch, loss_fn = small_model_batch
    ex = GradientExplorer(model, batch, loss_fn, modes=["hooks", "jax"], backend="static")
    assert "jax" in ex.state.errors and "unknown" in ex.state.errors["jax"]
    ex.controls["mode"].value = "jax"
    assert ex.state.mode == "hooks"
    assert "mode='jax' is invalid: this mode failed" in ex.error.message


def test_bad_values_refused(explorer):
    with pytest.raises(WidgetValueError, match="sample=12 is invalid"):
        explorer.state.sample = 12
    with pytest.raises(WidgetValueError, match="layer='9.weight' is invalid"):
        explorer.state.layer = "9.weight"


def test_model_left_unwrapped(small_model_batch):
    model, batch, loss_fn = small_model_batch
    GradientExplorer(model, batch, loss_fn, backend="static")
    assert all(not hasattr(p, "grad_sample") or p.grad_sample is None for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not model[0]._forward_hooks


def test_callback_error_is_displayed(explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_gradient", boom)
    explorer.controls["sample"].value = 3
    assert explorer.state.sample == 3
    assert "boom from a plot update" in explorer.error.message


@pytest.mark.parametrize(
    "shape, image", [((5,), (1, 5)), ((2, 3), (2, 3)), ((4, 2, 3), (7, 7)), ((2, 2, 3, 3), (7, 7))]
)
def test_gradient_image_shapes(shape, image):
    assert plots.gradient_image(np.ones(shape)).shape == image


def test_norms_only_mode_is_compared_and_refused(explorer):
    s = explorer.state
    if not s.norms_only:
        pytest.skip("no norms-only grad-sample mode registered")
    mode, diff = next(iter(s.norm_differences.items()))
    assert diff < 1e-4
    assert f"norms only: max |norm difference| = {diff:.2e}" in explorer.table.value
    explorer.controls["mode"].value = mode
    assert s.mode == s.reference
    assert "computes per-sample gradient norms without forming the gradients" in explorer.error.message


def test_compute_grad_samples_refuses_norms_only_mode(small_model_batch):
    from dpnotebook.modes import available_modes
    from dpnotebook.widgets import compute_grad_samples

    if "ghost" not in available_modes():
        pytest.skip("no ghost mode")
    model, (x, y), loss_fn = small_model_batch
    with pytest.raises(ValueError, match="grad_sample_mode='ghost' computes per-sample gradient norms"):
        compute_grad_samples(model, x, y, loss_fn, mode="ghost")


def test_grad_samples_by_mode_reads_results_as_the_library_does(small_model_batch):
    """One way to read a mode's result (dpnotebook.compare.mode_result): gradients, or ghost's norms,
    and the widget's name does not shadow dpnotebook.compare.compare_modes."""
    import dpnotebook.widgets.gradient as gradient
    from dpnotebook.compare import error_against
    from dpnotebook.widgets.grads import run_mode

    assert not hasattr(gradient, "compare_modes")
    model, (x, y), loss_fn = small_model_batch
    grads, norms_only, errors = gradient.grad_samples_by_mode(model, x, y, loss_fn)
    assert "hooks" in grads and not set(grads) & set(norms_only)
    ref = {name: g.double() for name, g in grads["hooks"].items()}
    for mode, g in grads.items():
        assert error_against(g, ref) < 1e-5, mode
    for mode, norms in norms_only.items():  # "ghost": compared by its norms
        assert norms.shape == (x.shape[0],)
        assert error_against(norms, ref) < 1e-4, mode
        assert isinstance(run_mode(model, x, y, loss_fn, mode=mode), torch.Tensor)
    assert all(p.grad is None and not hasattr(p, "grad_sample") for p in model.parameters())
