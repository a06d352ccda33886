"""The seeded toy data, augmentation and per-sample gradient helper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook.testing import reference_grad_samples
from dpnotebook.widgets import WidgetValueError, augment_copies, compute_grad_samples, make_blobs, make_toy
from dpnotebook.widgets.toy import bce_loss


def test_blobs_are_seeded():
    a, b = make_blobs(20, seed=3), make_blobs(20, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], make_blobs(20, seed=4)[0])
    assert a[1].sum() == 10


def test_toy_gradients_match_the_oracle():
    toy = make_toy(8, seed=0)
    got = toy.grad_samples()["weight"]
    ref = reference_grad_samples(toy.model, (toy.x,), target=toy.y, loss_fn=bce_loss)["weight"]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_compute_grad_samples_with_k_leaves_model_clean():
    model = nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.randn(2, 2)
    g = compute_grad_samples(model, augment_copies(x[:2], 2), y, nn.functional.mse_loss, K=2)
    assert g["weight"].shape == (2, 2, 3)
    assert not hasattr(model.weight, "grad_sample") and model.weight.grad is None


def test_augment_noise_and_shift():
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    out = augment_copies(x, 3, kind="shift", strength=1, seed=0)
    assert out.shape == (6, 1, 4, 4)
    for i in range(6):  # a shift keeps the pixels, only moves them
        assert torch.equal(out[i].flatten().sort().values, x[i // 3].flatten().sort().values)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(K=0), "K=0 is invalid"),
        (dict(K=2, kind="rotate"), "kind='rotate' is invalid"),
        (dict(K=2, strength=-1.0), "strength=-1.0 is invalid"),
    ],
)
def test_augment_refuses_bad_values(kwargs, text):
    with pytest.raises(ValueError, match=text):
        augment_copies(torch.zeros(2, 3), **kwargs)


def test_blobs_refuse_bad_values():
    with pytest.raises(WidgetValueError, match="n=1 is invalid"):
        make_blobs(1)
