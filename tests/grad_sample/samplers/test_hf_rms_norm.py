"""Hugging Face's ``T5LayerNorm`` and ``LlamaRMSNorm``: their grad sampler and ghost norm sampler against the float64
oracle, ``x_hat`` equal to their forward's in every dtype, a changed ``forward`` left to ``torch.func``, and the
auditor on adversarial records in hooks and ghost mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

import dpnotebook
from dpnotebook.audit import RECORDS, AuditCase, Family, audit_sensitivity
from dpnotebook.audit._cases import MAX_K, _apply_record
from dpnotebook.grad_sample import find_grad_sampler, unregister_grad_sampler
from dpnotebook.grad_sample.samplers import hf_rms_norm
from dpnotebook.grad_sample.samplers._contracts import ghost_handler, unregister_norm_sampler
from dpnotebook.testing import check_grad_sampler
from tests.grad_sample.ghost.test_ghost import check

NORMS = [T5LayerNorm, LlamaRMSNorm]


def _norm(cls: type[nn.Module], d: int = 5) -> nn.Module:
    torch.manual_seed(0)
    layer = cls(d, eps=1e-3)
    with torch.no_grad():
        layer.weight.normal_()  # type: ignore[operator]
    return layer


@pytest.mark.parametrize("B", [0, 2])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("cls", NORMS)
def test_the_grad_sampler_matches_the_oracle(cls: type[nn.Module], K: int, B: int) -> None:
    for shape in [(B * K, 5), (B * K, 4, 5)]:  # one vector per sample, a sequence per sample
        report = check_grad_sampler(_norm(cls), 3 * torch.randn(*shape), K=K)
        assert report.ok, (cls, K, B, shape, report)
        assert any("hf_rms_norm_grad_sampler" in r.strategy for r in report.rows), report


@pytest.mark.parametrize("cls", NORMS)
def test_in_float32_too(cls: type[nn.Module]) -> None:
    assert check_grad_sampler(_norm(cls), torch.randn(6, 4, 5), K=2, dtype=torch.float32).ok


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("cls", NORMS)
def test_ghost_norms_and_clipped_sums_match_the_oracle(cls: type[nn.Module], K: int) -> None:
    # The norm first: its float32 variance sees the very same inputs in the batch and in the oracle's per-sample
    # runs (behind a layer, a float64 roundoff difference may round the float32 variance the other way: 1e-9).
    model = nn.Sequential(_norm(cls, 3), nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    wrapped = check(model, torch.randn(4 * K, 6, 3), K=K)
    assert wrapped.strategies()["model.0"].startswith("materialised"), wrapped.strategies()


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float16),
    ],
)
@pytest.mark.parametrize("cls", NORMS)
def test_x_hat_is_the_forward_with_a_unit_weight(cls: type[nn.Module], dtypes: tuple[torch.dtype, ...]) -> None:
    """The variance in float32 and the casts of each class: bit for bit, whatever the input's and weight's dtypes."""
    x_dtype, w_dtype = dtypes
    layer = cls(5).to(w_dtype)
    x = (10 * torch.randn(3, 4, 5)).to(x_dtype)
    x_hat = {T5LayerNorm: hf_rms_norm.t5_x_hat, LlamaRMSNorm: hf_rms_norm.llama_x_hat}[cls](layer, x)
    y = layer(x)  # weight = 1: y is x_hat in the forward's output dtype
    assert torch.equal(x_hat.to(y.dtype), y) and x_hat.dtype in (y.dtype, x.dtype), (x_hat.dtype, y.dtype)


def test_the_zoo_norms_are_registered_for_both_modes() -> None:
    for cls in NORMS:
        entry, handler = find_grad_sampler(cls(4)), ghost_handler(cls(4))
        assert entry is not None and entry.name == "hf_rms_norm_grad_sampler"
        assert handler is not None and handler.materialises
    assert hf_rms_norm.UNRECOGNISED == {}


def test_a_changed_forward_is_not_registered_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later version that scales by ``1 + weight`` (as Gemma does): its layers stay torch.func units, exact."""

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (1 + self.weight) * hidden_states

    monkeypatch.setattr(T5LayerNorm, "forward", forward)
    monkeypatch.setattr(hf_rms_norm, "UNRECOGNISED", {})
    unregister_grad_sampler(T5LayerNorm)
    unregister_norm_sampler(T5LayerNorm)
    try:
        assert hf_rms_norm.register_known("transformers.models.t5.modeling_t5", "T5LayerNorm") is None
        assert find_grad_sampler(T5LayerNorm(4)) is None and ghost_handler(T5LayerNorm(4)) is None
        why = hf_rms_norm.UNRECOGNISED["transformers.models.t5.modeling_t5.T5LayerNorm"]
        assert "not the one hf_rms_norm's formula was written from" in why and "torch.func" in why
        wrapped = dpnotebook.wrap_model(nn.Sequential(T5LayerNorm(4)), "hooks")
        assert ("model.0", "torch.func") in wrapped.units  # the exact fallback
        wrapped.to_standard_module()
        assert check_grad_sampler(_norm(T5LayerNorm, 4), torch.randn(4, 4)).ok
    finally:
        monkeypatch.undo()
        assert hf_rms_norm.register_known("transformers.models.t5.modeling_t5", "T5LayerNorm") is T5LayerNorm


def test_a_layer_the_version_lacks_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_rms_norm, "UNRECOGNISED", {})
    monkeypatch.setitem(hf_rms_norm.KNOWN_FORWARDS, ("transformers.models.t5.modeling_t5", "T6Norm"), ("", abs))
    assert hf_rms_norm.register_known("transformers.models.t5.modeling_t5", "T6Norm") is None
    assert "cannot be imported" in hf_rms_norm.UNRECOGNISED["transformers.models.t5.modeling_t5.T6Norm"]


def test_a_subclass_that_overrides_forward_is_not_matched() -> None:
    class Doubled(LlamaRMSNorm):
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(hidden_states)

    assert find_grad_sampler(Doubled(3)) is None and ghost_handler(Doubled(3)) is None


def _seq(cls: type[nn.Module]) -> Family:
    return Family(
        cls.__name__,
        lambda bf: nn.Sequential(nn.Linear(8, 6), _norm(cls, 6), nn.Linear(6, 3)),
        (5, 8),
        (5, 3),
        sequence=True,
    )


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("cls", NORMS)
def test_the_auditor_finds_each_sample_moves_the_sum_by_at_most_C(cls: type[nn.Module], mode: str, record: str) -> None:
    family, gen = _seq(cls), torch.Generator().manual_seed(0)
    x, t = family.data(4, MAX_K, gen)
    case = AuditCase(family, record, *_apply_record(record, family, x, t, gen))
    for K in (1, 3):
        # In float64: in float32, the 1000x inputs of cancelling_positions give functorch mode (the exact replay of
        # the layer) the same 1.3e-5 overshoot as hooks mode, the model's own roundoff, not the sampler's.
        report = audit_sensitivity(
            case.model(True).double(),
            batch=lambda idx, K=K: tuple(t.double() for t in case.batch(idx, K=K, batch_first=True)),
            loss=case.loss(loss_reduction="mean", batch_first=True, K=K),
            num_samples=4,
            mode=mode,
            K=K,
            max_grad_norm=1.0,
        )
        assert report.ok(), (K, report)
        assert report.reference_gap < 1e-4 * max(1.0, report.max_ratio), (K, report.reference_gap)
