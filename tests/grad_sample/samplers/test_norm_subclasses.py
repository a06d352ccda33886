"""Norm layers that are not the built-in classes: subclasses of ``nn.GroupNorm``/``nn.LayerNorm`` that keep their
parent's ``forward`` (they get its samplers), subclasses that override it (timm's ``GroupNorm``: ``torch.func``,
exact), and a channels-first ``LayerNorm2d`` with :func:`channels_first_layer_norm_grad_sampler` registered for it."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpnotebook
from dpnotebook.audit import RECORDS, AuditCase, Family, audit_sensitivity
from dpnotebook.audit._cases import MAX_K, _apply_record
from dpnotebook.grad_sample import find_grad_sampler, register_grad_sampler, unregister_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import (
    ghost_handler,
    materialise,
    register_norm_sampler,
    unregister_norm_sampler,
)
from dpnotebook.grad_sample.samplers.norms import channels_first_layer_norm_grad_sampler
from dpnotebook.testing import check_grad_sampler
from tests.grad_sample.ghost.test_ghost import check


class ChannelsGroupNorm(nn.GroupNorm):
    """A GroupNorm with timm's argument order; ``forward`` is nn.GroupNorm's."""

    def __init__(self, num_channels: int, num_groups: int = 2, eps: float = 1e-5) -> None:
        super().__init__(num_groups, num_channels, eps=eps)


class TimmGroupNorm(ChannelsGroupNorm):
    """timm's ``GroupNorm``: overrides ``forward`` (same maths here, but no sampler can know that)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class PlainLayerNorm(nn.LayerNorm):
    """A LayerNorm subclass that only adds a method."""

    def extra_repr(self) -> str:
        return "plain"


class LayerNorm2d(nn.LayerNorm):
    """torchvision's ``LayerNorm2d``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


@pytest.fixture
def layer_norm_2d() -> object:
    """``channels_first_layer_norm_grad_sampler`` and ghost materialisation registered for ``LayerNorm2d``."""
    register_grad_sampler(LayerNorm2d)(channels_first_layer_norm_grad_sampler)
    register_norm_sampler(LayerNorm2d, materialises=True)(materialise)
    yield
    unregister_grad_sampler(LayerNorm2d)
    unregister_norm_sampler(LayerNorm2d)


def _random_affine(layer: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    return layer


def _units(model: nn.Module, mode: str) -> list[tuple[str, str]]:
    wrapped = dpnotebook.wrap_model(model, mode)
    units = list(wrapped.units)
    wrapped.to_standard_module()
    return units


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_subclass_that_keeps_forward_gets_its_parents_samplers(mode: str) -> None:
    assert find_grad_sampler(ChannelsGroupNorm(4)) is find_grad_sampler(nn.GroupNorm(2, 4))
    assert find_grad_sampler(PlainLayerNorm(4)) is find_grad_sampler(nn.LayerNorm(4))
    for layer in (ChannelsGroupNorm(4), PlainLayerNorm(4)):
        handler = ghost_handler(layer)
        assert handler is not None and handler.materialises
    units = _units(nn.Sequential(nn.Conv2d(2, 4, 1), ChannelsGroupNorm(4), PlainLayerNorm([4, 3, 3])), mode)
    assert not [u for u in units if u[1] == "torch.func"], units


@pytest.mark.parametrize("B", [0, 2])
@pytest.mark.parametrize("K", [1, 3])
def test_subclasses_that_keep_forward_match_the_oracle(K: int, B: int) -> None:
    for layer, shape in [(ChannelsGroupNorm(4), (B * K, 4, 3, 3)), (PlainLayerNorm(5), (B * K, 6, 5))]:
        report = check_grad_sampler(_random_affine(layer), torch.randn(*shape), K=K)
        assert report.ok and any("norm_grad_sampler" in r.strategy for r in report.rows), report


def test_a_subclass_that_overrides_forward_keeps_the_exact_fallback() -> None:
    """timm's GroupNorm: no sampler is inherited (its forward could compute anything); torch.func replays it."""
    layer = TimmGroupNorm(4)
    assert find_grad_sampler(layer) is None and ghost_handler(layer) is None
    for mode in ("hooks", "ghost"):
        assert ("model.1", "torch.func") in _units(nn.Sequential(nn.Conv2d(2, 4, 1), layer), mode)
    assert check_grad_sampler(_random_affine(TimmGroupNorm(4)), torch.randn(4, 4, 3, 3), K=2).ok


@pytest.mark.parametrize("B", [0, 2])
@pytest.mark.parametrize("K", [1, 3])
def test_the_channels_first_layer_norm_sampler_matches_the_oracle(layer_norm_2d: object, K: int, B: int) -> None:
    report = check_grad_sampler(_random_affine(LayerNorm2d(3, eps=1e-6)), 4 * torch.randn(B * K, 3, 5, 4), K=K)
    assert report.ok and any("channels_first_layer_norm_grad_sampler" in r.strategy for r in report.rows), report


@pytest.mark.parametrize("K", [1, 3])
def test_the_channels_first_layer_norm_in_ghost_mode(layer_norm_2d: object, K: int) -> None:
    model = nn.Sequential(LayerNorm2d(3), nn.Conv2d(3, 2, 3), nn.Flatten(1), nn.Linear(18, 2))
    wrapped = check(_random_affine(model), torch.randn(4 * K, 3, 5, 5), K=K)
    assert wrapped.strategies()["model.0"].startswith("materialised"), wrapped.strategies()


def test_the_channels_first_sampler_refuses_what_it_is_not(layer_norm_2d: object) -> None:
    class LayerNorm2x2(LayerNorm2d):  # normalises over two dims: not the channels-first form
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    register_grad_sampler(LayerNorm2x2)(channels_first_layer_norm_grad_sampler)
    try:
        with pytest.raises(ValueError, match=re.escape("has normalized_shape=(2, 2) and input of shape (2, 3, 2, 2)")):
            check_grad_sampler(LayerNorm2x2([2, 2]), torch.randn(2, 3, 2, 2))
    finally:
        unregister_grad_sampler(LayerNorm2x2)


IMAGE = Family(
    "layer_norm_2d",
    lambda bf: nn.Sequential(nn.Conv2d(2, 3, 1), _random_affine(LayerNorm2d(3)), nn.Flatten(1), nn.Linear(27, 2)),
    (2, 3, 3),
    (2,),
)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("record", [r for r in RECORDS if r != "cancelling_positions"])  # not a sequence
def test_the_auditor_finds_each_sample_moves_the_sum_by_at_most_C(
    layer_norm_2d: object, mode: str, record: str
) -> None:
    gen = torch.Generator().manual_seed(0)
    x, t = IMAGE.data(4, MAX_K, gen)
    case = AuditCase(IMAGE, record, *_apply_record(record, IMAGE, x, t, gen))
    for K in (1, 3):
        report = audit_sensitivity(
            case.model(True),
            batch=lambda idx, K=K: case.batch(idx, K=K, batch_first=True),
            loss=case.loss(loss_reduction="mean", batch_first=True, K=K),
            num_samples=4,
            mode=mode,
            K=K,
            max_grad_norm=1.0,
        )
        assert report.ok(), (K, report)
        assert report.reference_gap < 1e-4 * max(1.0, report.max_ratio), (K, report.reference_gap)
