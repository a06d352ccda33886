"""DPRNN/DPLSTM/DPGRU against nn.RNN/LSTM/GRU: parameters, state_dict, outputs, packing."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_sequence

from dpnotebook import GradSampleModule
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN
from dpnotebook.layers.rnn import pad_packed, repack

KINDS = {
    "lstm": (nn.LSTM, DPLSTM, {}),
    "gru": (nn.GRU, DPGRU, {}),
    "rnn_tanh": (nn.RNN, DPRNN, {}),
    "rnn_relu": (nn.RNN, DPRNN, {"nonlinearity": "relu"}),
}
OPTIONS = [
    dict(num_layers=L, bidirectional=bi, bias=bias, batch_first=bf)
    for L, bi, bias, bf in itertools.product([1, 2], [False, True], [True, False], [False, True])
]
TOL = {torch.float64: 1e-12, torch.float32: 1e-6}


def pair(kind: str, dtype: torch.dtype = torch.float64, **options) -> tuple[nn.Module, nn.Module]:
    """A native layer and its DP twin, built from the same random seed."""
    native_cls, dp_cls, extra = KINDS[kind]
    torch.manual_seed(1)
    native = native_cls(3, 4, **extra, **options).to(dtype)
    torch.manual_seed(1)
    dp = dp_cls(3, 4, **extra, **options).to(dtype)
    return native, dp


def states(out: tuple) -> list[torch.Tensor]:
    h = out[1]
    return list(h) if isinstance(h, tuple) else [h]


def assert_same(a: tuple, b: tuple, tol: float) -> None:
    ya, yb = (a[0].data, b[0].data) if hasattr(a[0], "batch_sizes") else (a[0], b[0])
    assert ya.shape == yb.shape
    assert (ya - yb).abs().max().item() <= tol
    for ha, hb in zip(states(a), states(b), strict=True):
        assert ha.shape == hb.shape
        assert (ha - hb).abs().max().item() <= tol


@pytest.mark.parametrize("kind", KINDS)
def test_same_names_state_dict_and_initialisation(kind: str) -> None:
    for options in OPTIONS:
        native, dp = pair(kind, **options)
        assert [n for n, _ in dp.named_parameters()] == [n for n, _ in native.named_parameters()]
        nsd, dsd = native.state_dict(), dp.state_dict()
        assert list(dsd) == list(nsd)
        assert all(torch.equal(nsd[k], dsd[k]) for k in nsd)  # same draws in the same order
        assert len(list(dp.parameters())) == len(list(native.parameters()))
        assert [[p.shape for p in w] for w in dp.all_weights] == [[p.shape for p in w] for w in native.all_weights]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_outputs_match_both_load_directions(kind: str, dtype: torch.dtype) -> None:
    for options in OPTIONS:
        native, dp = pair(kind, dtype, **options)
        torch.manual_seed(2)
        other = native_cls_fresh(kind, dtype, **options)
        x = torch.randn(2, 5, 3, dtype=dtype)  # [B, T, F] or [T, B, F]: both fine
        dp.load_state_dict(other.state_dict())  # native -> DP
        assert_same(other(x), dp(x), TOL[dtype])
        native.load_state_dict(dp.state_dict())  # DP -> native
        assert_same(native(x), dp(x), TOL[dtype])
        D, L = 1 + options["bidirectional"], options["num_layers"]
        B = x.shape[0 if options["batch_first"] else 1]
        h0 = torch.randn(L * D, B, 4, dtype=dtype)
        hx = (h0, torch.randn_like(h0)) if kind == "lstm" else h0
        assert_same(native(x, hx), dp(x, hx), TOL[dtype])
        unbatched = x[0]
        hx1 = (h0[:, 0], hx[1][:, 0]) if kind == "lstm" else h0[:, 0]  # strided: the DP layer takes it as it is
        dense = tuple(h.contiguous() for h in hx1) if kind == "lstm" else hx1.contiguous()  # cuDNN's nn.LSTM needs
        assert_same(native(unbatched, dense), dp(unbatched, hx1), TOL[dtype])


def native_cls_fresh(kind: str, dtype: torch.dtype, **options) -> nn.Module:
    native_cls, _, extra = KINDS[kind]
    return native_cls(3, 4, **extra, **options).to(dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_packed_sequences(kind: str, enforce_sorted: bool) -> None:
    lengths = [5, 3, 3, 1] if enforce_sorted else [2, 5, 1, 3]
    for options in OPTIONS[::3]:
        native, dp = pair(kind, **options)
        seqs = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
        with torch.device("cpu"):  # its lengths: PyTorch wants them on the CPU, whatever the data's device
            packed = pack_sequence(seqs, enforce_sorted=enforce_sorted)
        D, L = 1 + options["bidirectional"], options["num_layers"]
        h0 = torch.randn(L * D, len(seqs), 4, dtype=torch.float64)
        hx = (h0, torch.randn_like(h0)) if kind == "lstm" else h0
        for args in ((packed,), (packed, hx)):
            a, b = native(*args), dp(*args)
            assert_same(a, b, 1e-12)
            assert torch.equal(a[0].batch_sizes, b[0].batch_sizes)
            for idx in ("sorted_indices", "unsorted_indices"):
                ia, ib = getattr(a[0], idx), getattr(b[0], idx)
                assert (ia is None and ib is None) or torch.equal(ia, ib)


def test_packed_gradients_match_native() -> None:
    native, dp = pair("lstm", num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 3, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([4, 1, 3], device="cpu"), batch_first=True, enforce_sorted=False)
    for model in (native, dp):
        out, (h, c) = model(packed)
        (out.data.square().sum() + h.sum() + c.sum()).backward()
    for (n, p), q in zip(native.named_parameters(), dp.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", OPTIONS[::3], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_gradients_match_native(kind: str, options: dict) -> None:
    """Backpropagation through time: input, initial state and parameter gradients equal torch.nn's."""
    native, dp = pair(kind, **options)
    D, L = 1 + options["bidirectional"], options["num_layers"]
    x = torch.randn(3, 6, 3, dtype=torch.float64)
    h0 = torch.randn(L * D, x.shape[0 if options["batch_first"] else 1], 4, dtype=torch.float64)
    grads = []
    for model in (native, dp):
        xs = x.clone().requires_grad_()
        hs = [h0.clone().requires_grad_() for _ in range(2 if kind == "lstm" else 1)]
        out, final = model(xs, tuple(hs) if kind == "lstm" else hs[0])
        finals = final if kind == "lstm" else (final,)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
        (loss + sum((f * f).sum() for f in finals)).backward()
        grads.append([xs.grad, *(h.grad for h in hs), *(p.grad for p in model.parameters())])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_dropout_between_layers_only_in_training() -> None:
    native, dp = pair("lstm", num_layers=2, dropout=0.5)
    x = torch.randn(6, 3, 3, dtype=torch.float64)
    dp.train()
    assert not torch.allclose(dp(x)[0], dp(x)[0])  # random masks between the layers
    native.eval(), dp.eval()
    assert_same(native(x), dp(x), 1e-12)
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        DPGRU(3, 4, dropout=0.3)


def test_argument_and_input_errors_match_torch() -> None:
    with pytest.raises(NotImplementedError, match="proj_size"):
        DPLSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        DPRNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        DPGRU(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="hidden_size must be greater than zero"):
        DPLSTM(3, 0)
    lstm = DPLSTM(3, 4)
    with pytest.raises(RuntimeError, match="input_size. Expected 3, got 2"):
        lstm(torch.randn(5, 2, 2))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 2, 4\)"):
        lstm(torch.randn(5, 2, 3), (torch.zeros(1, 3, 4), torch.zeros(1, 3, 4)))
    with pytest.raises(TypeError, match=r"\(h0, c0\)"):
        lstm(torch.randn(5, 2, 3), torch.zeros(1, 2, 4))


def test_parameter_objects_stay_shared_with_the_units() -> None:
    """Replacing, converting or copying parameters keeps the units pointing at the layer's own."""

    def shared(m: DPLSTM) -> bool:
        return all(
            getattr(unit, slot) is getattr(m, name)
            for unit, names in zip(m.gate_projections, m._all_weights, strict=True)
            for slot, name in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), names, strict=False)  # no biases: 2
        )

    native, dp = pair("lstm", num_layers=2, bidirectional=True)
    assert shared(dp)
    dp.load_state_dict(native.state_dict(), assign=True)
    assert shared(dp) and dp.weight_ih_l1_reverse is not None
    dp.weight_hh_l0 = nn.Parameter(torch.zeros_like(dp.weight_hh_l0))
    assert shared(dp) and dp.gate_projections[0].weight_hh.abs().sum() == 0
    assert shared(dp.float()) and dp.gate_projections[3].weight_ih.dtype == torch.float32
    assert shared(copy.deepcopy(dp))
    assert len(list(dp.parameters())) == 16 and len(dp.state_dict()) == 16


def test_hooks_mode_sees_one_unit_per_layer_and_direction() -> None:
    dp = DPGRU(3, 4, num_layers=2, bidirectional=True)
    wrapped = GradSampleModule(nn.Sequential(dp))
    assert wrapped.units == [(f"model.0.gate_projections.{i}", "gate_projection_grad_sampler") for i in range(4)]


def test_packed_batches_whatever_the_default_device() -> None:
    """pad_packed builds its indices beside batch_sizes (the CPU): a default device elsewhere (a user's
    ``torch.set_default_device("cuda")``; here "meta", which holds no data) must not move them."""
    # not pack_sequence: it makes its lengths on the default device, and torch wants them on the CPU
    rows = pad_sequence([torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)])
    seq = pack_padded_sequence(rows, torch.tensor([2, 4, 1], device="cpu"), enforce_sorted=False)
    with torch.device("meta"):
        padded = pad_packed(seq)
    assert padded.x.device == seq.data.device and padded.mask is not None
    assert torch.equal(repack(padded.x, seq, padded).data, seq.data)
