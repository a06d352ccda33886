"""``LoRALinear`` and its grad sampler: the oracle, every mode, the sensitivity auditor, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook import wrap_model
from dpnotebook.audit import audit_sensitivity
from dpnotebook.grad_sample import find_grad_sampler
from dpnotebook.grad_sample.samplers.lora import lora_grad_sampler
from dpnotebook.layers.lora import LoRALinear, add_lora
from dpnotebook.testing import check_grad_sampler

MODES = ["hooks", "functorch", "ew", "ghost"]


def lora(in_f: int = 4, out_f: int = 3, rank: int = 2, alpha: float | None = 3.0, bias: bool = True) -> LoRALinear:
    layer = LoRALinear(in_f, out_f, rank=rank, alpha=alpha, bias=bias, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # B = 0 would make A's gradient 0: nothing would be checked
        layer.lora_B.normal_(generator=torch.Generator().manual_seed(2))
        if layer.bias is not None:
            layer.bias.normal_(generator=torch.Generator().manual_seed(3))
    return layer


def test_registered() -> None:
    assert find_grad_sampler(lora()).name == "lora_grad_sampler"


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("extra", [(), (2,)])
def test_against_oracle(K: int, reduction: str, dtype: torch.dtype, extra: tuple) -> None:
    x = torch.randn(4 * K, *extra, 4, generator=torch.Generator().manual_seed(K))
    report = check_grad_sampler(lora(), x, K=K, loss_reduction=reduction, dtype=dtype)
    assert {r.name for r in report.rows} == {"lora_A", "lora_B"}
    assert report.ok


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("trained", [("lora_A",), ("lora_B",), ("weight", "bias", "lora_A", "lora_B"), ("bias",)])
def test_frozen_and_unfrozen_parameters(K: int, trained: tuple) -> None:
    layer = lora()
    for name, p in layer.named_parameters():
        p.requires_grad_(name in trained)
    report = check_grad_sampler(layer, torch.randn(3 * K, 4), K=K, loss_reduction="sum")
    assert {r.name for r in report.rows} == set(trained) and report.ok
    wrapped = wrap_model(layer, "hooks", K=K)
    wrapped(torch.randn(3 * K, 4)).sum().backward()
    for name, p in layer.named_parameters():
        assert (getattr(p, "grad_sample", None) is not None) == (name in trained), name


@pytest.mark.parametrize("K", [1, 3])
def test_empty_batch(K: int) -> None:
    layer = lora()
    check_grad_sampler(layer, torch.randn(0, 4), K=K)
    wrapped = wrap_model(layer, "hooks", K=K)
    wrapped(torch.randn(0, 4)).sum().backward()
    assert layer.lora_A.grad_sample.shape == (0, 2, 4) and layer.lora_B.grad_sample.shape == (0, 3, 2)


class _ScaledLoRA(LoRALinear):
    """Same output as LoRALinear; its own forward, so it needs (and gets) its own, wrong, sampler below."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_wrong_sampler_is_caught() -> None:
    """The oracle check can fail: a sampler that forgets the scale alpha / r is refused."""
    from dpnotebook.errors import GradSamplerMismatch
    from dpnotebook.grad_sample import register_grad_sampler, unregister_grad_sampler

    @register_grad_sampler(_ScaledLoRA)
    def forgets_scale(layer, activations, backprops, K):  # type: ignore[no-untyped-def]
        found = lora_grad_sampler(layer, activations, backprops, K)
        return {p: g / layer.scale for p, g in found.items()}

    try:
        layer = _ScaledLoRA(4, 3, rank=2, alpha=6.0)
        torch.nn.init.normal_(layer.lora_B)
        with pytest.raises(GradSamplerMismatch, match="differ from the oracle"):
            check_grad_sampler(layer, torch.randn(4, 4), fallback=False)
    finally:
        unregister_grad_sampler(_ScaledLoRA)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("record", ["normal", "huge", "zero"])
def test_sensitivity_audit(mode: str, K: int, reduction: str, record: str) -> None:
    """Each sample moves the clipped sum by at most C, and the sum is the definition's, in every mode."""
    torch.manual_seed(0)
    model = nn.Sequential(lora(4, 5, rank=2), nn.Tanh(), lora(5, 3, rank=1, alpha=None))
    rows = torch.randn(5, K, 4, generator=torch.Generator().manual_seed(K))
    if record == "huge":
        rows[2] *= 1e4
    elif record == "zero":
        rows[2] = 0.0
    report = audit_sensitivity(
        model,
        batch=lambda idx: rows[idx].reshape(-1, 4),
        loss=lambda m, x: m(x).pow(2).sum() / (x.shape[0] if reduction == "mean" else 1),
        num_samples=5,
        mode=mode,
        K=K,
        loss_reduction=reduction,
        max_grad_norm=0.5,
    )
    assert report.ok(), report.table()
    assert report.reference_gap < 1e-4, report.table()
    assert report.max_ratio > 0.5  # the big records are clipped to C, not lost


def test_ghost_materialises_lora_with_its_sampler() -> None:
    """Ghost mode has no norm trick for LoRALinear: the hooks engine's registered sampler computes it."""
    model = nn.Sequential(lora(), nn.Tanh(), nn.Linear(3, 2))
    wrapped = wrap_model(model, "ghost")
    units = dict(wrapped.units)
    assert units == {"model.0": "lora_grad_sampler", "model.2": "ghost"}, units


def test_from_linear_and_add_lora() -> None:
    base = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    before = base(x)
    model = add_lora(base, rank=2, names=["2"])
    assert isinstance(model[2], LoRALinear) and type(model[0]) is nn.Linear
    assert torch.equal(model(x), before)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["2.lora_A", "2.lora_B"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rank=0), "rank=0"),
        (dict(rank=2.0), "rank=2.0"),
        (dict(rank=1, alpha=-1.0), "alpha=-1.0"),
        (dict(rank=1, alpha=float("nan")), "alpha=nan"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoRALinear(3, 2, **kwargs)


def test_add_lora_bad_names() -> None:
    with pytest.raises(ValueError, match="are not nn.Linear layers"):
        add_lora(nn.Sequential(nn.Linear(2, 2)), rank=1, names=["1"])
    with pytest.raises(TypeError, match="from_linear"):
        add_lora(nn.Linear(2, 2), rank=1)
    with pytest.raises(TypeError, match="from_linear takes an nn.Linear"):
        LoRALinear.from_linear(nn.Conv1d(1, 1, 1), rank=1)
