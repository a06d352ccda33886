"""A user's layer takes part in ghost mode through register_norm_sampler, and the bound holds."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import dpnotebook
from dpnotebook.audit import audit_sensitivity
from dpnotebook.grad_sample import register_norm_sampler, unregister_grad_sampler, unregister_norm_sampler
from dpnotebook.grad_sample.samplers._contracts import ghost_handler, materialise, norm_sampler_types


class Scale(nn.Module):
    """y = x * w, one weight per feature."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.w


def scale_sampler(layer: Scale, activations: list[Tensor], backprops: Tensor, K: int) -> dict:
    per_row = activations[0] * backprops
    return {layer.w: per_row.view(-1, K, per_row.shape[-1]).mean(1)}


@pytest.fixture
def registered():
    dpnotebook.register_grad_sampler(Scale)(scale_sampler)
    register_norm_sampler(Scale, materialises=True)(materialise)
    try:
        yield
    finally:
        unregister_norm_sampler(Scale)
        unregister_grad_sampler(Scale)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), Scale(6), nn.Linear(6, 2)).double()


@pytest.mark.parametrize("K", [1, 3])
def test_a_registered_norm_sampler_keeps_the_bound_and_matches_the_definition(registered: None, K: int) -> None:
    x = (
        torch.randn(5 * K, 4, dtype=torch.float64)
        * torch.tensor([1.0, 1e2, 1e4, 1.0, 1e-3]).repeat_interleave(K)[:, None]
    )
    y = torch.randn(5 * K, 2, dtype=torch.float64)

    def rows(idx: list[int]) -> Tensor:
        return torch.cat([torch.arange(i * K, i * K + K) for i in idx]).long() if len(idx) else torch.zeros(0).long()

    report = audit_sensitivity(
        _model(),
        batch=lambda idx: (x[rows(idx)], y[rows(idx)]),
        loss=lambda m, b: ((m(b[0]) - b[1]) ** 2).sum(),
        num_samples=5,
        mode="ghost",
        K=K,
        loss_reduction="sum",
        max_grad_norm=1.0,
    )
    assert report.ok() and report.max_ratio <= 1 + 1e-5
    assert report.reference_gap < 1e-6  # the ghost step equals each sample's float64 gradient, clipped and summed


def test_the_layer_is_ghosted_only_while_registered(registered: None) -> None:
    wrapped = dpnotebook.wrap_model(_model(), "ghost")
    assert "model.1" in wrapped.ghost_paths
    assert Scale in norm_sampler_types()
    unregister_norm_sampler(Scale)
    assert ghost_handler(Scale(2)) is None
    assert "model.1" not in dpnotebook.wrap_model(_model(), "ghost").ghost_paths  # back to the hooks engine


def test_a_subclass_that_overrides_forward_is_not_matched(registered: None) -> None:
    class Shifted(Scale):
        def forward(self, x: Tensor) -> Tensor:
            return x * self.w + 1

    assert ghost_handler(Scale(2)) is not None and ghost_handler(Shifted(2)) is None


def test_only_module_types_can_be_registered() -> None:
    with pytest.raises(TypeError, match="nn.Module subclasses"):
        register_norm_sampler(int)
