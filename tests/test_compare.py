"""compare_modes reports agreement with the oracle, and refusals instead of crashing."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dpnotebook import compare
from dpnotebook.compare import FLOAT32_TOLERANCE, TF32_TOLERANCE, agreement_tolerance, compare_modes
from dpnotebook.modes import available_modes


def test_modes_agree_on_a_small_cnn_with_k() -> None:
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))
    x, y = torch.randn(6, 1, 6, 6), torch.randint(0, 4, (6,))
    rows = compare_modes(model, x, y, K=2, repeats=1)
    assert [r.mode for r in rows] == ["oracle", *available_modes()]
    assert all(r.agrees and r.max_error < 1e-5 for r in rows)


def test_a_refusing_mode_is_reported_not_raised() -> None:
    model = nn.Sequential(nn.EmbeddingBag(10, 4), nn.Linear(4, 2))
    x, y = torch.randint(0, 10, (4, 3)), torch.randint(0, 2, (4,))
    rows = {r.mode: r for r in compare_modes(model, x, y, repeats=1)}
    assert not rows["ew"].agrees and "embedding_bag" in rows["ew"].error
    assert rows["hooks"].agrees


def test_a_wrong_result_is_not_called_agreement() -> None:
    model = nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    rows = {r.mode: r for r in compare_modes(model, x, y, repeats=1, tolerance=-1.0)}
    assert not rows["hooks"].agrees  # nothing can be within a negative tolerance


class _OnGPU(nn.Module):
    """Stands in for a model on a CUDA GPU (this machine may have none): a parameter that says it is there."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def parameters(self, recurse: bool = True):  # type: ignore[override]
        yield SimpleNamespace(is_cuda=True, dtype=self.dtype)


@pytest.mark.parametrize("tf32", [True, False])
def test_the_tolerance_is_tf32s_only_where_a_gpu_may_round_float32_to_tf32(
    monkeypatch: pytest.MonkeyPatch, tf32: bool
) -> None:
    monkeypatch.setattr(compare, "tf32_allowed", lambda: tf32)
    assert agreement_tolerance(_OnGPU(torch.float32)) == (TF32_TOLERANCE if tf32 else FLOAT32_TOLERANCE)
    assert agreement_tolerance(_OnGPU(torch.float64)) == FLOAT32_TOLERANCE  # no TF32 for float64
    assert agreement_tolerance(nn.Linear(2, 2, device="cpu")) == FLOAT32_TOLERANCE  # on the CPU
    assert FLOAT32_TOLERANCE < TF32_TOLERANCE < 0.1  # a wrong row is off by O(1): still told apart


def test_tf32_allowed_reads_pytorchs_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert compare.tf32_allowed() is bool(torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert compare.tf32_allowed() is True
