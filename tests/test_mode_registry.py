"""The mode registry names wrapper classes; the privacy side pairs each mode with its optimizer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from dpnotebook import modes
from dpnotebook.grad_sample import (
    FunctorchGradSampleModule,
    GhostGradSampleModule,
    GradSampleModule,
    GradSampleModuleExpandedWeights,
    GradSampleModuleNoOp,
)
from dpnotebook.privacy import PrivacyEngine
from dpnotebook.privacy._optimizer import MODE_OPTIMIZERS, DPOptimizer, optimizer_class


class MarkedOptimizer(DPOptimizer):
    """A DP optimizer a test mode pairs with."""


@pytest.fixture
def marked_mode():
    @modes.register_mode("marked", validates_as="hooks", listed=False)
    class Marked(GradSampleModule):
        grad_sample_mode = "marked"

    MODE_OPTIMIZERS["marked"] = MarkedOptimizer
    try:
        yield Marked
    finally:
        MODE_OPTIMIZERS.pop("marked")
        for table in (modes._MODES, modes._VALIDATES_AS):
            table.pop("marked", None)
        modes._UNLISTED.discard("marked")


def test_the_registry_holds_each_mode_class() -> None:
    expected = {
        "hooks": GradSampleModule,
        "functorch": FunctorchGradSampleModule,
        "ew": GradSampleModuleExpandedWeights,
        "ghost": GhostGradSampleModule,
        "no_op": GradSampleModuleNoOp,
    }
    assert {name: modes.mode_class(name) for name in expected} == expected
    assert modes.available_modes() == ["ew", "functorch", "ghost", "hooks"]  # no_op is unlisted
    assert [modes.validates_as(m) for m in ("ghost", "hooks", "no_op")] == ["hooks", "hooks", "no_op"]


def test_the_registry_names_no_optimizer_and_loads_nothing_by_name() -> None:
    source = Path(modes.__file__).read_text(encoding="utf-8")
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not {m for m in imported if m and (m.startswith("dpnotebook") or m == "importlib")}, imported


def test_a_registered_mode_wraps_and_validates_as_declared(marked_mode: type) -> None:
    assert type(modes.wrap_model(nn.Linear(2, 2), "marked")) is marked_mode
    assert modes.validates_as("marked") == "hooks"
    assert "marked" not in modes.available_modes()


def test_make_private_builds_the_optimizer_paired_with_the_mode(marked_mode: type) -> None:
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
def test_every_built_in_mode_has_its_optimizer(mode: str, expected: str) -> None:
    assert optimizer_class(mode).__name__ == expected


def test_an_unknown_mode_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"grad_sample_mode='hook' is unknown; choose one of \['ew'"):
        optimizer_class("hook")
    with pytest.raises(ValueError, match=r"mode='hook' is unknown; choose one of \['ew'"):
        modes.validates_as("hook")
