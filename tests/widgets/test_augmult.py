"""AugmultExplorer: K shrinks the norm and the variance, the clipped fraction follows; GradSampleModule's K."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from dpnotebook.grad_sample import GradSampleModule
from dpnotebook.privacy import per_sample_norms
from dpnotebook.widgets import AugmultExplorer, WidgetValueError, augment_copies
from dpnotebook.widgets.augmult import plots


@pytest.fixture(scope="module")
def explorer():
    return AugmultExplorer(k_max=6, backend="static")


def test_k_slider_moves_everything(explorer, fignums):
    ex = explorer
    ex.controls["K"].value = 1
    counts_1 = ex.hist.hist.get_data().values.copy()
    ex.controls["K"].value = 6
    assert ex.state.K == 6
    assert ex.curves.k_line.get_xdata()[0] == 6
    assert ex.fraction.point.get_xdata()[0] == 6
    assert not np.array_equal(ex.hist.hist.get_data().values, counts_1)
    assert ex.label.get_text().startswith("K = 6")


def test_averaging_shrinks_norm_and_variance(explorer):
    t = explorer.state.table
    assert t.norm[-1] < t.norm[0]
    assert t.variance[-1] < 0.5 * t.variance[0]


def test_norms_are_grad_sample_modules(explorer):
    """The table's K=3 norms are those of GradSampleModule(K=3) on the same augmented batch."""
    from dpnotebook.widgets.toy import ToyMLP, bce_loss, make_blobs

    x, y = make_blobs(64, seed=0, outliers=0)
    model = GradSampleModule(ToyMLP(16, seed=0), K=3)
    xa = augment_copies(x, 3, kind="noise", strength=1.0, seed=0)
    bce_loss(model(xa), y.repeat_interleave(3)).backward()
    norms = per_sample_norms([p.grad_sample for p in model.parameters()]).cpu().numpy()
    np.testing.assert_allclose(explorer.state.table.norms[2], norms, rtol=1e-5)


def test_c_changes_the_fraction_curve(explorer):
    explorer.state.max_grad_norm = 1e-3
    assert (explorer.fraction.curve.get_ydata() == 1.0).all()
    explorer.state.max_grad_norm = 1e3
    assert (explorer.fraction.curve.get_ydata() == 0.0).all()
    assert explorer.hist.c_line.get_xdata()[0] == 1e3


@pytest.mark.parametrize(
    "name, value, text",
    [
        ("K", 0, "K=0 is invalid"),
        ("K", 7, "K=7 is invalid: it must be <= k_max=6"),
        ("max_grad_norm", -1.0, "max_grad_norm=-1.0 is invalid"),
    ],
)
def test_bad_values_refused(explorer, name, value, text):
    with pytest.raises(WidgetValueError, match=text):
        setattr(explorer.state, name, value)


def test_images_with_shift_augmentation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
    aug = functools.partial(augment_copies, kind="shift", strength=2)
    ex = AugmultExplorer(model, x, y, nn.functional.cross_entropy, augment=aug, k_max=3, backend="static")
    assert len(ex.state.table.norm) == 3 and ex.state.table.variance[0] > 0


def test_callback_error_is_displayed(explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_k_curves", boom)
    explorer.controls["K"].value = 2
    assert "boom from a plot update" in explorer.error.message
    explorer.error.clear()
