"""The mode registry and what each mode refuses, with messages that name the way out."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook import GradSampleError, UnsupportedModuleError
from dpnotebook.grad_sample._engine.accumulation import grad_sample_rows
from dpnotebook.testing import reference_grad_samples


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0][:, -1])


def test_unknown_mode_lists_the_registry() -> None:
    keys = re.escape(str(dpnotebook.available_modes()))
    assert {"ew", "functorch", "hooks"} <= set(dpnotebook.available_modes())
    with pytest.raises(ValueError, match=rf"grad_sample_mode='vmap' is unknown; choose one of {keys}"):
        dpnotebook.wrap_model(nn.Linear(2, 2), "vmap")


@pytest.mark.parametrize("mode", ["functorch", "ew"])
@pytest.mark.parametrize("K", [1, 3])
def test_native_lstm_in_modes_that_can_compute_it(mode: str, K: int) -> None:
    # functorch batches native nn.LSTM only through oneDNN's float32 kernel on CPU
    # (the float64 kernel does an in-place update that vmap cannot batch), so it is
    # checked in float32 against the float64 oracle.
    dtype, rtol = (torch.float32, 1e-5) if mode == "functorch" else (torch.float64, 1e-10)
    model = LSTMClassifier().to(dtype)
    x = torch.randn(2 * K, 5, 3, dtype=dtype)
    target = torch.randn(2 * K, 2, dtype=dtype)
    if mode == "functorch" and x.device.type != "cpu":  # cuDNN's LSTM cannot be batched by vmap: refused
        with pytest.raises(UnsupportedModuleError, match="fused recurrent kernel"):
            dpnotebook.wrap_model(model, mode, K=K, loss_reduction="sum")
        return
    ref = reference_grad_samples(model, [x], target=target, K=K)
    wrapped = dpnotebook.wrap_model(model, mode, K=K, loss_reduction="sum")
    (wrapped(x) * target).sum().backward()
    scale = max(r.abs().max().item() for r in ref.values())
    for n, p in model.named_parameters():
        err = (p.grad_sample.double() - ref[n]).abs().max().item()
        assert err <= rtol * scale, (n, err, scale)


def test_functorch_handles_batch_first_false() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 4, 3, dtype=torch.float64)  # [T, B*K, d]
    target = torch.randn(5, 4, 2, dtype=torch.float64)
    ref = reference_grad_samples(model, [x], target=target, K=2, batch_first=False)
    wrapped = dpnotebook.wrap_model(model, "functorch", K=2, batch_first=False, loss_reduction="sum")
    (wrapped(x) * target).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)


class CountsForwards(nn.Module):
    """A small model that counts its forward calls: each replay chunk is one more."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.body(x)


@pytest.mark.parametrize(
    ("replay_chunk", "B", "K", "replays"),
    [("auto", 7, 1, 1), ("auto", 7, 4, 4), ("auto", 3, 16, 3), (None, 7, 4, 1), (3, 7, 4, 3)],
)
def test_functorch_replays_in_chunks_that_match_the_oracle(replay_chunk, B: int, K: int, replays: int) -> None:
    # "auto" keeps each replay to at most B + K - 1 rows: ceil(B/K) samples at a time.
    model = CountsForwards()
    x = torch.randn(B * K, 3, dtype=torch.float64)
    target = torch.randn(B * K, 2, dtype=torch.float64)
    ref = reference_grad_samples(model.body, [x], target=target, K=K)
    wrapped = dpnotebook.wrap_model(model, "functorch", K=K, loss_reduction="sum", replay_chunk=replay_chunk)
    (wrapped(x) * target).sum().backward()
    assert model.calls == 1 + replays
    for n, p in model.body.named_parameters():
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "all"])
def test_bad_replay_chunk_is_refused_with_the_choices(bad) -> None:
    with pytest.raises(ValueError, match=rf"replay_chunk={re.escape(repr(bad))} is invalid; use \"auto\""):
        dpnotebook.wrap_model(nn.Linear(2, 2), "functorch", K=2, replay_chunk=bad)


def test_functorch_refuses_sample_mixing_layers() -> None:
    with pytest.raises(dpnotebook.UnsupportedModuleError, match=r"model.1 \(BatchNorm1d\)"):
        dpnotebook.wrap_model(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), "functorch")


def test_ew_refusals_name_the_mode_to_use() -> None:
    with pytest.raises(ValueError, match=r"'ew' cannot handle batch_first=False.*'hooks' or 'functorch'"):
        dpnotebook.wrap_model(nn.Linear(2, 2), "ew", batch_first=False)
    wrapped = dpnotebook.wrap_model(nn.Linear(2, 2), "ew")
    with pytest.raises(ValueError, match=r"cannot run an empty batch.*'hooks' or 'functorch'"):
        wrapped(torch.randn(0, 2))
    bag = dpnotebook.wrap_model(nn.EmbeddingBag(5, 2), "ew")
    with pytest.raises(
        GradSampleError, match=r"no per-sample rule for 'embedding_bag'.*grad_sample_mode='functorch', or 'hooks'"
    ):
        bag(torch.randint(0, 5, (2, 3)))
    mha = nn.MultiheadAttention(4, 2, batch_first=True)
    x = torch.randn(2, 3, 4)
    with pytest.raises(
        GradSampleError, match=r"multi_head_attention_forward.*'functorch', or 'hooks' \(after dpnotebook.fix"
    ):
        dpnotebook.wrap_model(mha, "ew")(x, x, x)


def test_ew_accumulates_like_hooks_and_unwraps() -> None:
    model = nn.Linear(3, 2)
    wrapped = dpnotebook.wrap_model(model, "ew", K=2)
    wrapped(torch.randn(4, 3)).sum().backward()
    wrapped(torch.randn(6, 3)).sum().backward()
    assert [tuple(g.shape) for g in model.weight.grad_sample] == [(2, 2, 3), (3, 2, 3)]  # one per backward pass
    wrapped.zero_grad()
    wrapped.forbid_grad_accumulation()
    wrapped(torch.randn(4, 3)).sum().backward()
    with pytest.raises(GradSampleError, match="zero_grad"):
        wrapped(torch.randn(4, 3)).sum().backward()
    assert wrapped.to_standard_module() is model
    assert not hasattr(model.weight, "grad_sample")


# -- ew: what ExpandedWeights would mix up is refused, naming the mode to use ------------------------
def test_ew_refuses_two_forward_passes_in_one_backward() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    wrapped = dpnotebook.wrap_model(model, "ew", loss_reduction="sum")
    x = torch.randn(8, 3)
    loss = wrapped(x[:4]).sum() + wrapped(x[4:]).sum()  # row i of one pass would be added to row i of the other
    with pytest.raises(
        GradSampleError,
        match=(
            r"^grad_sample_mode='ew': one backward pass went through 2 forward passes \(rows \[4, 4\]\).*"
            r"Fix: call backward after each forward pass.*'hooks', 'functorch' or 'ghost'"
        ),
    ):
        loss.backward()
    assert all(p.grad_sample is None for p in model.parameters())
    wrapped.zero_grad()
    wrapped(x[:4]).sum().backward()  # one pass per backward: accepted, samples appended
    wrapped(x[4:]).sum().backward()
    ref = reference_grad_samples(model, [x], target=torch.ones(8, 2))
    for name, p in model.named_parameters():
        torch.testing.assert_close(grad_sample_rows(p).double(), ref[name], rtol=1e-5, atol=1e-6)


class TimeMajorInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.transpose(0, 1)).transpose(0, 1)  # the layer sees T rows


def test_ew_names_a_layer_that_sees_other_rows_than_the_input() -> None:
    wrapped = dpnotebook.wrap_model(TimeMajorInside(), "ew")
    with pytest.raises(
        GradSampleError,
        match=(
            r"^grad_sample_mode='ew': a layer saw 5 rows in dim 0 where the input has 4 \(B\*K\).*"
            r"Fix: use grad_sample_mode='hooks' or 'ghost'.*or 'functorch', which replays the whole model per sample"
        ),
    ):
        wrapped(torch.randn(4, 5, 3))


def test_ew_refuses_a_module_reached_by_two_paths() -> None:
    shared = nn.Linear(3, 3)
    model = nn.Sequential(nn.Sequential(shared, nn.Tanh()), nn.Sequential(shared, nn.Tanh()), nn.Linear(3, 2))
    with pytest.raises(
        ValueError,
        match=(
            r"^grad_sample_mode='ew': model.0.0 and model.1.0 are one Linear reached by two paths.*"
            r"Fix: use grad_sample_mode='functorch'"
        ),
    ):
        dpnotebook.wrap_model(model, "ew")
