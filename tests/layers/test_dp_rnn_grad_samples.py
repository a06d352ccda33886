"""Per-sample gradients of DPLSTM/DPGRU/DPRNN against the float64 microbatching oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from dpnotebook import GradSampleError, GradSampleModule
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN
from dpnotebook.modes import wrap_model
from dpnotebook.testing import dot_loss, random_target, reference_grad_samples

LAYERS = {
    "lstm": lambda **kw: DPLSTM(3, 4, **kw),
    "gru": lambda **kw: DPGRU(3, 4, **kw),
    "rnn_tanh": lambda **kw: DPRNN(3, 4, **kw),
    "rnn_relu": lambda **kw: DPRNN(3, 4, nonlinearity="relu", **kw),
}
CASES = settings(max_examples=6, deadline=None, derandomize=True)


class UsesEverything(nn.Module):
    """Feeds its own initial state and returns the outputs *and* the final hidden state.

    Inputs and output hold the batch in dim 0 (``batch_first``) or dim 1, as the wrapper expects.
    """

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        bf = self.rnn.batch_first
        h0 = h0.transpose(0, 1) if bf else h0  # the layer wants [L*D, B, H]
        hx = (h0, torch.tanh(h0)) if isinstance(self.rnn, DPLSTM) else h0
        out, h = self.rnn(x, hx)
        h = h[0] if isinstance(h, tuple) else h
        out = out if bf else out.transpose(0, 1)
        both = torch.cat([out.flatten(1), h.transpose(0, 1).flatten(1)], 1)  # [B, ...]
        return both if bf else both.T


def grad_samples(
    model: nn.Module, inputs: list, mode: str, K: int, reduction: str, bf: bool, target: torch.Tensor
) -> dict:
    wrapped = wrap_model(model, mode, K=K, batch_first=bf, loss_reduction=reduction)
    loss = dot_loss(wrapped(*inputs), target)
    rows = target.shape[0 if bf else 1]
    (loss / rows if reduction == "mean" else loss).backward()
    found = {n: getattr(p, "grad_sample", None) for n, p in model.named_parameters()}
    wrapped.to_standard_module()
    model.zero_grad()
    return found


def assert_close_to_oracle(got: dict, ref: dict, tol: float = 1e-10) -> None:
    for name, g in got.items():
        assert (g is None) == (name not in ref), name  # frozen parameters get no grad_sample
    for name, r in ref.items():
        err = (got[name] - r).abs().max().item() / max(r.abs().max().item(), 1e-300)
        assert err <= tol, (name, err)


@CASES
@given(
    kind=st.sampled_from(sorted(LAYERS)),
    K=st.sampled_from([1, 3]),
    reduction=st.sampled_from(["mean", "sum"]),
    bf=st.booleans(),
    layers=st.sampled_from([1, 2]),
    bidirectional=st.booleans(),
)
def test_hooks_and_functorch_match_the_oracle(
    kind: str, K: int, reduction: str, bf: bool, layers: int, bidirectional: bool
) -> None:
    torch.manual_seed(0)
    rnn = LAYERS[kind](num_layers=layers, bidirectional=bidirectional, batch_first=bf).double()
    model = UsesEverything(rnn)
    B, T, LD = 2, 4, layers * (1 + bidirectional)
    x = torch.randn(B * K, T, 3, dtype=torch.float64)
    h0 = torch.randn(B * K, LD, 4, dtype=torch.float64)
    if not bf:
        x, h0 = x.transpose(0, 1), h0.transpose(0, 1)
    ref = reference_grad_samples(model, [x, h0], K=K, batch_first=bf)
    target = random_target(model, (x, h0))
    for mode in ("hooks", "functorch"):
        assert_close_to_oracle(grad_samples(model, [x, h0], mode, K, reduction, bf, target), ref)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_packed_sequences_in_hooks_mode(kind: str) -> None:
    class Packs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = LAYERS[kind](num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            out, h = self.rnn(pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False))
            h = h[0] if isinstance(h, tuple) else h
            padded = torch.zeros(x.shape[0], x.shape[1], 8, dtype=x.dtype).index_put(_packed_positions(out), out.data)
            return torch.cat([padded.flatten(1), h.transpose(0, 1).flatten(1)], 1)

    model = Packs().double()
    K = 2
    x = torch.randn(3 * K, 5, 3, dtype=torch.float64)
    lengths = torch.tensor([5, 5, 2, 3, 1, 4])
    split = lambda inputs, r: (inputs[0][r : r + 1], inputs[1][r : r + 1])  # noqa: E731
    ref = reference_grad_samples(model, [x, lengths], K=K, split=split)
    target = random_target(model, (x, lengths))
    assert_close_to_oracle(grad_samples(model, [x, lengths], "hooks", K, "sum", True, target), ref)


def _packed_positions(seq: nn.utils.rnn.PackedSequence) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, time) of each row of ``seq.data``, in the original sample order, on the data's device.

    Built beside ``batch_sizes``, which torch keeps on the CPU whatever the default device
    (``pytest --device cuda``)."""
    cpu = seq.batch_sizes.device
    time = torch.repeat_interleave(torch.arange(len(seq.batch_sizes), device=cpu), seq.batch_sizes)
    starts = torch.cumsum(seq.batch_sizes, 0) - seq.batch_sizes
    rank = torch.arange(len(time), device=cpu) - starts[time]
    device = seq.data.device
    return seq.sorted_indices.to(device)[rank.to(device)], time.to(device)


def test_a_layer_called_twice_adds_up_and_frozen_parameters_are_skipped() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = DPLSTM(3, 4, batch_first=True)
            self.head = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(x)
            return self.rnn(self.head(out))[0]  # the same layer on its own (projected) output

    model = Twice().double()
    model.rnn.bias_hh_l0.requires_grad_(False)
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    ref = reference_grad_samples(model, [x], K=3)
    target = random_target(model, (x,))
    got = grad_samples(model, [x], "hooks", 3, "mean", True, target)
    assert got["rnn.bias_hh_l0"] is None and "rnn.bias_hh_l0" not in ref
    assert_close_to_oracle(got, ref)


def test_float32_matches_the_oracle_to_float32_precision() -> None:
    model = UsesEverything(DPGRU(3, 4, num_layers=2, batch_first=True))
    x, h0 = torch.randn(4, 5, 3), torch.randn(4, 2, 4)
    ref = reference_grad_samples(model, [x, h0], K=2)
    target = random_target(model.double(), (x.double(), h0.double())).float()
    # 5e-5: cuDNN's fused float32 GRU (a GPU run, TF32 off) was 1.17e-5 from the oracle on an H100; the loop < 1e-5
    assert_close_to_oracle(grad_samples(model.float(), [x, h0], "hooks", 2, "mean", True, target), ref, tol=5e-5)


def test_gate_projection_called_on_its_own_says_what_is_wrong() -> None:
    lstm = DPLSTM(3, 4, batch_first=True)
    unit = lstm.gate_projections[0]
    wrapped = GradSampleModule(unit)
    from dpnotebook.units import HiddenRecord

    with pytest.raises(GradSampleError, match="outside its recurrent layer"):
        wrapped(torch.randn(2, 3, 3), HiddenRecord(reverse=False)).sum().backward()
