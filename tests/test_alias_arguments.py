"""Bad input to the Opacus-path aliases written this release gets an error naming the argument and the fix."""

from __future__ import annotations

import pytest
from torch import nn

from dpnotebook.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from dpnotebook.grad_sample.utils import get_gsm_class, wrap_model


def test_get_privacy_spent_needs_one_rdp_value_per_order() -> None:
    with pytest.raises(ValueError, match=r"orders has 3 entries and rdp 2; give one RDP value per order"):
        get_privacy_spent(orders=[2.0, 4.0, 8.0], rdp=[0.1, 0.2], delta=1e-5)


def test_compute_rdp_takes_one_order_or_many() -> None:
    many = compute_rdp(q=0.1, noise_multiplier=1.0, steps=10, orders=[2.0, 8.0])
    assert compute_rdp(q=0.1, noise_multiplier=1.0, steps=10, orders=8.0) == pytest.approx(many[1])


def test_wrap_model_takes_its_options_by_keyword() -> None:
    with pytest.raises(TypeError, match=r"wrap_model\(model, 'hooks', True\): give batch_first=, loss_reduction="):
        wrap_model(nn.Linear(2, 2), "hooks", True)


def test_an_unknown_mode_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"grad_sample_mode='hook' is unknown; choose one of \['ew'"):
        get_gsm_class("hook")
