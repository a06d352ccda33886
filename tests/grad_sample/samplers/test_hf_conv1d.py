"""Hugging Face's ``Conv1D`` (GPT-2): its grad sampler and its ghost norm sampler against the float64 oracle,
the auditor on adversarial records, and GPT-2 with no ``torch.func`` unit in hooks or ghost mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

import dpnotebook
from dpnotebook.audit import FLOAT32_TOLERANCE, RECORDS, TOLERANCE, AuditCase, Family, audit_sensitivity
from dpnotebook.audit._cases import MAX_K, _apply_record
from dpnotebook.benchmarks.zoo import build
from dpnotebook.grad_sample import find_grad_sampler
from dpnotebook.models import Logits
from dpnotebook.testing import check_grad_sampler
from tests.grad_sample.ghost.test_ghost import _released, check


def _mlp(T: int) -> nn.Module:
    """Conv1D(nf=6, nx=8), tanh, Conv1D(nf=3, nx=6): in != out, so a transposed weight shows."""
    torch.manual_seed(0)
    return nn.Sequential(Conv1D(6, 8), nn.Tanh(), Conv1D(3, 6))


@pytest.mark.parametrize("K", [1, 2])
def test_the_grad_sampler_matches_the_oracle(K: int) -> None:
    report = check_grad_sampler(_mlp(4), torch.randn(3 * K, 4, 8), K=K)
    assert report.ok and any("conv1d_grad_sampler" in r.strategy for r in report.rows)


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("T", [3, 40])  # n = K*T: Gram norms at n=3, settled (per-sample gradients formed) from n=6
def test_ghost_norms_and_clipped_sums_match_the_oracle(K: int, T: int) -> None:
    wrapped = check(_mlp(T), torch.randn(3 * K, T, 8), K=K)
    assert wrapped.strategies()["model.0"] == ("ghost gram" if T == 3 and K == 1 else "materialised (direct)")
    assert _released(wrapped)["model.0"] == [T == 40 or K == 2]


def test_gpt2_has_no_torch_func_unit_and_ghost_matches_the_oracle() -> None:
    """The zoo's GPT-2, called with per-sample position ids: Conv1D is sampled, the tied embedding too."""
    torch.manual_seed(0)
    model = Logits(build("gpt2").model.model, ("input_ids", "position_ids"))
    ids, positions = torch.randint(0, 32, (3, 6)), torch.arange(6).expand(3, 6)
    for mode in ("hooks", "ghost"):
        wrapped = dpnotebook.wrap_model(model, mode)
        units = wrapped.units
        wrapped.to_standard_module()
        assert not [u for u in units if u[1] == "torch.func"], (mode, units)
    wrapped = check(model, ids, positions)
    assert wrapped.strategies()["model.model.transformer.h.0.attn.c_attn"].startswith("ghost")


def test_a_subclass_that_overrides_forward_is_not_matched() -> None:
    class Scaled(Conv1D):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    assert find_grad_sampler(Conv1D(2, 3)) is not None and find_grad_sampler(Scaled(2, 3)) is None


SEQ = Family("conv1d", lambda bf: nn.Sequential(Conv1D(6, 8), nn.Tanh(), Conv1D(3, 6)), (5, 8), (5, 3), sequence=True)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("record", RECORDS)
def test_the_auditor_finds_each_sample_moves_the_sum_by_at_most_C(mode: str, record: str, device) -> None:
    # float32 on CUDA rounds with the batch's composition (docs/guarantees.md, "On a GPU")
    tolerance = TOLERANCE if device.type == "cpu" else FLOAT32_TOLERANCE
    gen = torch.Generator().manual_seed(0)
    x, t = SEQ.data(4, MAX_K, gen)
    case = AuditCase(SEQ, record, *_apply_record(record, SEQ, x, t, gen))
    for K in (1, 2):
        report = audit_sensitivity(
            case.model(True),
            batch=lambda idx, K=K: case.batch(idx, K=K, batch_first=True),
            loss=case.loss(loss_reduction="mean", batch_first=True, K=K),
            num_samples=4,
            mode=mode,
            K=K,
            max_grad_norm=1.0,
        )
        assert report.ok(tolerance), (K, report)
        assert report.reference_gap < 1e-4 * max(1.0, report.max_ratio), (K, report.reference_gap)


def test_a_library_version_whose_layer_cannot_be_imported_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours fails to import (a transformers without Conv1D): lookups go on, without that sampler."""
    import sys

    from dpnotebook.grad_sample import _registry as registry

    monkeypatch.setitem(registry.OPTIONAL_SAMPLERS, "json", "dpnotebook.no_such_module")  # json is imported
    monkeypatch.setattr(registry, "_UNLOADABLE", set())
    assert "json" in sys.modules
    assert find_grad_sampler(nn.Linear(2, 2)) is not None
    assert registry._UNLOADABLE == {"dpnotebook.no_such_module"}
