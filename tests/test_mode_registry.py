"""The mode registry carries each mode's optimizer, and make_private builds the one registered."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook import mode_registry
from dpnotebook.grad_sample.engine.module import GradSampleModule
from dpnotebook.privacy import PrivacyEngine
from dpnotebook.privacy._optimizer import MODE_OPTIMIZERS, DPOptimizer


class MarkedOptimizer(DPOptimizer):
    """A DP optimizer a test mode names."""


@pytest.fixture
def marked_mode():
    @mode_registry.register_mode("marked", optimizer="tests.test_mode_registry:MarkedOptimizer", listed=False)
    def _marked(module: nn.Module, **kwargs) -> nn.Module:
        wrapped = GradSampleModule(module, **kwargs)
        wrapped.grad_sample_mode = "marked"
        return wrapped

    MODE_OPTIMIZERS["marked"] = MarkedOptimizer  # make_private reads the privacy side's mode -> optimizer table
    try:
        yield
    finally:
        for table in (mode_registry._MODES, mode_registry._VALIDATES_AS, mode_registry._OPTIMIZERS):
            table.pop("marked", None)
        MODE_OPTIMIZERS.pop("marked", None)
        mode_registry._UNLISTED.discard("marked")


def test_make_private_builds_the_optimizer_the_mode_registered(marked_mode: None) -> None:
    model = nn.Linear(3, 2)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 2)), batch_size=4
    )
    _, optimizer, _ = PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        grad_sample_mode="marked",
    )
    assert type(optimizer) is MarkedOptimizer


@pytest.mark.parametrize(
    "mode,expected",
    [("hooks", "DPOptimizer"), ("functorch", "DPOptimizer"), ("ew", "DPOptimizer"), ("ghost", "GhostDPOptimizer")],
)
def test_every_built_in_mode_names_its_optimizer(mode: str, expected: str) -> None:
    assert mode_registry.optimizer_class(mode).__name__ == expected


def test_an_unknown_mode_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"grad_sample_mode='hook' is unknown; choose one of \['ew'"):
        mode_registry.optimizer_class("hook")
