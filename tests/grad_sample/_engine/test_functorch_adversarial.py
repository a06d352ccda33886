"""Functorch mode (and ExpandedWeights) on layouts that used to give one row per something else.

* ``batch_first=False`` with a batch-first output (``[T, B, D]`` in, ``[B, classes]`` out): the
  output's batch dim is found, and the per-sample gradients match the float64 oracle.
* An output with several dims of the batch's size (``[T, B, H]`` with ``T == B``, ``[B, B]`` logits):
  one extra forward pass on one more row tells which dim is the batch.
* A ``PackedSequence`` (rows are time steps, not samples): refused, naming the fix.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import dpnotebook
from dpnotebook import GradSampleError
from dpnotebook.testing import reference_grad_samples


class LastHidden(nn.Module):
    """``[T, B, D]`` in, ``[B, classes]`` out: an LSTM's last hidden state through a Linear."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.rnn = nn.LSTM(5, 6)
        self.fc = nn.Linear(6, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[1][0][-1])


class MeanOverTime(nn.Module):
    """``[T, B, D]`` in, ``[B, classes]`` out, without a recurrent layer (runs in float64)."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 6)
        self.fc = nn.Linear(6, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.proj(x)).mean(0))


class EveryStep(nn.Module):
    """``[T, B, D]`` in, ``[T, B, classes]`` out: the batch stays in dim 1."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(5, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0])


class TimeMajorInput(nn.Module):
    """Reads ``[B, T, D]`` (what the oracle slices by row) and hands ``[T, B, D]`` to ``model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.transpose(0, 1))


def _check_against_oracle(model, x, target, *, K, loss_reduction, out_batch_dim, rtol) -> None:
    """Per-sample gradients of functorch mode (batch_first=False) against the float64 oracle."""
    rows = x.shape[1]
    if out_batch_dim == 0:
        ref = reference_grad_samples(TimeMajorInput(model), [x.transpose(0, 1)], target=target, K=K)
    else:
        ref = reference_grad_samples(model, [x], target=target, K=K, batch_first=False)
    ref = {name.removeprefix("model."): g for name, g in ref.items()}
    wrapped = dpnotebook.wrap_model(model, "functorch", K=K, batch_first=False, loss_reduction=loss_reduction)
    out = wrapped(x)
    assert out.shape == target.shape  # the user gets the layout the model returned
    loss = (out * target).sum()
    (loss / rows if loss_reduction == "mean" else loss).backward()
    scale = max(r.abs().max().item() for r in ref.values())
    for name, p in model.named_parameters():
        assert p.grad_sample.shape == (rows // K, *p.shape), name
        err = (p.grad_sample.double() - ref[name]).abs().max().item()
        assert err <= rtol * scale, (name, err, scale)


@pytest.mark.parametrize("loss_reduction", ["mean", "sum"])
@pytest.mark.parametrize("K", [1, 3])
def test_batch_first_false_with_a_batch_first_output_matches_the_oracle(K: int, loss_reduction: str) -> None:
    torch.manual_seed(0)
    B = 4
    # nn.LSTM: functorch batches only its float32 CPU kernel, checked against the float64 oracle
    x = torch.randn(7, B * K, 5)
    _check_against_oracle(
        LastHidden(), x, torch.randn(B * K, 3), K=K, loss_reduction=loss_reduction, out_batch_dim=0, rtol=1e-5
    )
    x = torch.randn(7, B * K, 5, dtype=torch.float64)
    _check_against_oracle(
        MeanOverTime().double(),
        x,
        torch.randn(B * K, 3, dtype=torch.float64),
        K=K,
        loss_reduction=loss_reduction,
        out_batch_dim=0,
        rtol=1e-10,
    )


@pytest.mark.parametrize("K", [1, 2])
def test_an_output_with_two_dims_of_the_batch_size_is_told_apart_by_one_more_row(K: int) -> None:
    torch.manual_seed(1)
    rows = 2 * K
    # [B*K, classes] with classes == B*K: only the probe can tell dim 0 from dim 1
    x = torch.randn(5, rows, 5, dtype=torch.float64)
    _check_against_oracle(
        MeanOverTime(classes=rows).double(),
        x,
        torch.randn(rows, rows, dtype=torch.float64),
        K=K,
        loss_reduction="mean",
        out_batch_dim=0,
        rtol=1e-10,
    )
    # [T, B*K, classes] with T == B*K: the batch stays in dim 1
    x = torch.randn(rows, rows, 5)
    _check_against_oracle(
        EveryStep(), x, torch.randn(rows, rows, 3), K=K, loss_reduction="sum", out_batch_dim=1, rtol=1e-5
    )


class Pooled(nn.Module):
    """Returns one row for the whole batch: nothing can be split per sample."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum(1)


def test_an_output_without_the_batch_is_refused_with_its_shape() -> None:
    wrapped = dpnotebook.wrap_model(Pooled(), "functorch", batch_first=False)
    with pytest.raises(GradSampleError, match=r"output of shape \(7, 3\) has no dim of the input's 4 rows"):
        wrapped(torch.randn(7, 4, 5))


class PackedLSTM(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self.fc = nn.Linear(6, 3)

    def forward(self, x) -> torch.Tensor:
        return self.fc(self.rnn(x)[1][0][-1])


class PackedLinear(nn.Module):
    """A Linear on the packed rows: one row per time step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x) -> torch.Tensor:
        return self.fc(x.data)


def _packed() -> torch.nn.utils.rnn.PackedSequence:
    return pack_padded_sequence(torch.randn(3, 2, 5), torch.tensor([3, 2], device="cpu"))


@pytest.mark.parametrize("mode", ["functorch", "ew"])
@pytest.mark.parametrize(
    "make",
    [lambda: PackedLSTM(nn.LSTM(5, 6)), lambda: PackedLSTM(dpnotebook.DPLSTM(5, 6)), PackedLinear],
    ids=["lstm", "dplstm", "linear"],
)
def test_a_packed_sequence_is_refused_and_the_fix_named(mode: str, make) -> None:
    model = make()
    wrapped = dpnotebook.wrap_model(model, mode, strict=False)
    with pytest.raises(
        GradSampleError,
        match=(
            rf"grad_sample_mode='{mode}': {type(model).__name__} received a PackedSequence \(batch_sizes=\[2, 2, 1\]\)"
            r".*rows are time steps, not samples.*Fix: use grad_sample_mode='hooks' with dpnotebook.DPLSTM"
        ),
    ):
        wrapped(_packed())


def test_hooks_mode_with_dplstm_takes_the_packed_sequence() -> None:
    model = PackedLSTM(dpnotebook.DPLSTM(5, 6))
    wrapped = dpnotebook.wrap_model(model, "hooks")
    wrapped(_packed()).sum().backward()
    assert model.fc.weight.grad_sample.shape == (2, 3, 6)


class OneScorePerSample(nn.Module):
    """``[T, B, D]`` in, ``[B]`` out."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).mean(0).squeeze(-1)


@pytest.mark.parametrize("K", [1, 3])
def test_a_one_dim_output_per_sample_matches_the_oracle(K: int) -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 2 * K, 5, dtype=torch.float64)
    _check_against_oracle(
        OneScorePerSample().double(),
        x,
        torch.randn(2 * K, dtype=torch.float64),
        K=K,
        loss_reduction="mean",
        out_batch_dim=0,
        rtol=1e-10,
    )
