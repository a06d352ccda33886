"""The fused recurrence (PyTorch's RNN operator on the gate inputs) against the Python loop.

Both paths must give the same outputs, summed gradients and per-sample gradients
in every mode, to float64 rounding; the choice between them is made in one place.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import dpnotebook.layers.recurrence as recurrence
from dpnotebook.audit import RECORDS, audit_case, audit_sensitivity
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN
from dpnotebook.layers.recurrence import choose_recurrence
from dpnotebook.modes import wrap_model
from tests.layers.test_dp_rnn_grad_samples import UsesEverything, grad_samples

KINDS = {
    "lstm": (nn.LSTM, lambda **kw: DPLSTM(3, 4, **kw)),
    "gru": (nn.GRU, lambda **kw: DPGRU(3, 4, **kw)),
    "rnn_tanh": (nn.RNN, lambda **kw: DPRNN(3, 4, **kw)),
    "rnn_relu": (nn.RNN, lambda **kw: DPRNN(3, 4, nonlinearity="relu", **kw)),
}
OPTIONS = [
    dict(num_layers=L, bidirectional=bi, bias=bias, batch_first=bf)
    for L, bi, bias, bf in itertools.product([1, 2], [False, True], [True, False], [False, True])
]


def _both(kind: str, **options) -> tuple[nn.Module, nn.Module]:
    """The same DP layer twice: one forced to loop, one forced to fuse."""
    torch.manual_seed(1)
    loop = KINDS[kind][1](**options).double()
    torch.manual_seed(1)
    fused = KINDS[kind][1](**options).double()
    loop.recurrence, fused.recurrence = "loop", "fused"
    return loop, fused


def _flat(out: tuple) -> list[torch.Tensor]:
    y, h = out
    y = y.data if hasattr(y, "batch_sizes") else y
    return [y, *(h if isinstance(h, tuple) else (h,))]


def _max_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [t.shape for t in a] == [t.shape for t in b]
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_states_and_summed_gradients_agree(kind: str) -> None:
    for options in OPTIONS:
        loop, fused = _both(kind, dropout=0.0, **options)
        LD, bf = options["num_layers"] * (1 + options["bidirectional"]), options["batch_first"]
        x = torch.randn(2, 5, 3, dtype=torch.float64)
        x = x if bf else x.transpose(0, 1)
        h0 = torch.randn(LD, 2, 4, dtype=torch.float64)
        hx = (h0, torch.tanh(h0)) if kind == "lstm" else h0
        for args in ((x,), (x, hx), (x[0] if bf else x[:, 0],)):  # zeros, given state, unbatched
            a, b = _flat(loop(*args)), _flat(fused(*args))
            assert _max_gap(a, b) <= 1e-13, (options, len(args))
            sum(t.sum() * (i + 1) for i, t in enumerate(a)).backward()
            sum(t.sum() * (i + 1) for i, t in enumerate(b)).backward()
            grads = [[p.grad for p in m.parameters()] for m in (loop, fused)]
            assert _max_gap(*grads) <= 1e-12, options
            loop.zero_grad(), fused.zero_grad()


def test_the_fused_layer_matches_torch_nn() -> None:
    torch.manual_seed(1)
    native = nn.GRU(3, 4, num_layers=2, bidirectional=True).double()
    dp = DPGRU(3, 4, num_layers=2, bidirectional=True).double()
    dp.load_state_dict(native.state_dict())
    dp.recurrence = "fused"
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    assert _max_gap(_flat(native(x)), _flat(dp(x))) <= 1e-13


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("K", [1, 3])
def test_per_sample_gradients_agree_in_hooks_and_functorch(kind: str, K: int) -> None:
    loop, fused = _both(kind, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(2 * K, 4, 3, dtype=torch.float64)
    h0 = torch.randn(2 * K, 4, 4, dtype=torch.float64)
    target = torch.randn(2 * K, 4 * 8 + 4 * 4, dtype=torch.float64)
    for mode in ("hooks", "functorch"):
        a = grad_samples(UsesEverything(loop), [x, h0], mode, K, "mean", True, target)
        b = grad_samples(UsesEverything(fused), [x, h0], mode, K, "mean", True, target)
        assert a.keys() == b.keys()
        assert _max_gap(list(a.values()), list(b.values())) <= 1e-12, mode


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("K", [1, 3])
def test_ghost_norms_agree(kind: str, K: int) -> None:
    norms = []
    for layer in _both(kind, bidirectional=True, batch_first=True):
        wrapped = wrap_model(layer, "ghost", K=K, batch_first=True)
        torch.manual_seed(2)
        out, _ = wrapped(torch.randn(2 * K, 5, 3, dtype=torch.float64))
        (out * torch.randn_like(out)).sum().backward()
        norms.append(wrapped.per_sample_norms())
    assert norms[0].shape == (2,)
    assert (norms[0] - norms[1]).abs().max().item() <= 1e-12 * norms[0].max().item()


def test_the_choice_is_made_in_one_place() -> None:
    gx = torch.zeros(3, 2, 8, device="cpu")
    mask = torch.ones(3, 2, 1, dtype=torch.bool)
    assert choose_recurrence("auto", gx, None) == "loop"  # on the CPU the loop is faster
    on_gpu = SimpleNamespace(is_cuda=True)  # stands in for a CUDA tensor: only .is_cuda is read
    assert choose_recurrence("auto", on_gpu, None) == "fused"  # type: ignore[arg-type]
    with torch.backends.cudnn.flags(enabled=False):
        assert choose_recurrence("auto", on_gpu, None) == "loop"  # type: ignore[arg-type]
    assert choose_recurrence("fused", gx, None) == "fused"
    assert choose_recurrence("loop", gx, None) == "loop"
    assert choose_recurrence("fused", gx, mask) == "loop"  # unequal lengths: states must freeze
    seen = []
    torch.func.vmap(lambda g: seen.append(choose_recurrence("fused", g, None)) or g)(gx)
    assert seen == ["loop"]  # vmap has no rule for the fused operator
    with pytest.raises(ValueError, match=r"recurrence='cudnn' is not one of \('auto', 'fused', 'loop'\)"):
        choose_recurrence("cudnn", gx, None)


def test_a_layer_with_a_bad_setting_says_so() -> None:
    lstm = DPLSTM(3, 4)
    lstm.recurrence = "fast"
    with pytest.raises(ValueError, match="recurrence='fast'"):
        lstm(torch.randn(2, 1, 3))


def test_packed_batches_fuse_only_when_all_lengths_are_equal(monkeypatch) -> None:
    calls: list[str] = []
    real_fused, real_loop = recurrence.run_fused, recurrence.run_direction
    import dpnotebook.layers.rnn as rnn_module

    monkeypatch.setattr(rnn_module, "run_fused", lambda *a, **k: calls.append("fused") or real_fused(*a, **k))
    monkeypatch.setattr(rnn_module, "run_direction", lambda *a, **k: calls.append("loop") or real_loop(*a, **k))
    loop, fused = _both("lstm", bidirectional=True)
    for lengths, expected in (([3, 3], "fused"), ([1, 3], "loop")):
        seqs = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
        with torch.device("cpu"):  # its lengths: PyTorch wants them on the CPU, whatever the data's device
            seq = pack_sequence(seqs, enforce_sorted=False)
        calls.clear()
        got = _flat(fused(seq))
        assert calls == [expected, expected]
        assert _max_gap(_flat(loop(seq)), got) <= 1e-13


def test_the_constants_survive_inference_mode() -> None:
    recurrence._constant.cache_clear()
    lstm = DPLSTM(3, 4)
    lstm.recurrence = "fused"
    with torch.inference_mode():
        lstm(torch.randn(2, 1, 3))  # makes the cached identity first
    out, _ = lstm(torch.randn(2, 1, 3))
    out.sum().backward()  # the identity is saved for backward: it must not be an inference tensor
    assert lstm.weight_hh_l0.grad is not None


@pytest.mark.parametrize("record", ["scale_1e4", "cancelling_copies", "cancelling_positions"])
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_fused_dplstm_moves_the_sum_by_at_most_c(record: str, mode: str) -> None:
    assert record in RECORDS
    case = audit_case("lstm", record)
    model = case.model(True)
    model.lstm.recurrence = "fused"
    report = audit_sensitivity(
        model,
        batch=lambda idx: case.batch(idx, K=3, batch_first=True),
        loss=case.loss(loss_reduction="sum", batch_first=True, K=3),
        num_samples=case.num_samples,
        mode=mode,
        K=3,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )
    assert report.ok(), report.table()
    assert report.max_ratio <= 1.0 + 1e-6
