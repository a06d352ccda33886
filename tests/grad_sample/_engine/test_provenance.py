"""Per-sample rows are proven, not counted: the provenance probe (issue #28, item 7).

The regression: a T5-style relative-position bias at ``B*K == T`` passed the row count, and one
example moved the step by 1.39-1.42 C in hooks, ghost and ew mode. It is measured here with
neighbours that keep the batch size (the removed example's loss weight set to 0), so that no
count check can refuse it.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import dpnotebook
from dpnotebook.audit import RelativeBias, audit_sensitivity
from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample import GradSampleModule
from dpnotebook.grad_sample._engine.provenance import probe_rows
from dpnotebook.layers import DPMultiheadAttention

REFUSED = r"model\.rel \(Embedding\): its rows are not the samples\..*grad_sample_mode='functorch'"


def _same_size_audit(mode: str, B: int, K: int, T: int = 4):
    """The sensitivity audit of the T5-style replica at ``B`` samples of ``K`` rows and ``T`` positions.

    A neighbour keeps all ``B`` samples and zeroes the removed one's targets (its loss weight).
    """
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 11, (B, 1, T), generator=gen).expand(B, K, T).reshape(B * K, T)
    t = 10 * torch.randn(B * K, T, 3, generator=gen, dtype=torch.float64)

    def batch(indices: list[int]) -> tuple[Tensor, Tensor]:
        w = torch.zeros(B, dtype=torch.float64)
        w[indices] = 1
        return x, t * w.repeat_interleave(K)[:, None, None]

    torch.manual_seed(0)
    return audit_sensitivity(
        RelativeBias().double(),
        batch=batch,
        loss=lambda m, b: (m(b[0]) * b[1]).sum(),
        num_samples=B,
        mode=mode,
        K=K,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )


@pytest.mark.parametrize("B,K", [(4, 1), (2, 2)], ids=["B=T", "BK=T"])
def test_relative_position_bias_at_b_equal_t_is_refused_in_ew_mode(B: int, K: int) -> None:
    """Failed on 3c3f8c6: no error, and one sample moved the step by 1.39 C (B = T) or 1.41 C (B*K = T)."""
    with pytest.raises(GradSampleError, match=REFUSED):
        _same_size_audit("ew", B, K)


@pytest.mark.parametrize("B,K", [(4, 1), (2, 2)], ids=["B=T", "BK=T"])
@pytest.mark.parametrize("mode", ["functorch", "hooks", "ghost"])
def test_relative_position_bias_is_right_in_functorch_hooks_and_ghost_mode(mode: str, B: int, K: int) -> None:
    """Hooks and ghost mode refused it until issue #30; the bias is now known to be batch-free (tracked)."""
    report = _same_size_audit(mode, B, K)
    assert report.ok() and report.reference_gap < 1e-9


def test_without_the_probe_and_the_tracker_the_same_audit_finds_the_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit above is adversarial: with the probe and the tracker switched off, the row count lets it through."""
    monkeypatch.setattr(GradSampleModule, "probes_rows", False)
    monkeypatch.setattr(GradSampleModule, "tracks_broadcasts", False)
    report = _same_size_audit("hooks", 4, 1)
    # the weights are drawn on the test's device: the gap from the oracle was 0.131 on the CPU and 0.058 on
    # an H200 (2026-11-27), against < 1e-9 with the probe (above); the step moved by 1.39 C and 1.43 C
    assert 1.3 < report.max_ratio < 1.5 and report.reference_gap > 0.01


# -- what each half of the probe catches ---------------------------------------------------
def _layers(model: nn.Module, *names: str) -> list:
    return [(f"model.{n}", model.get_submodule(n), 0) for n in names]


def test_a_zero_initialised_bias_table_is_caught_by_the_backward_check() -> None:
    """Every row of the bias is 0, so replacing a sample changes nothing; the gradients are positions."""
    model = RelativeBias()
    nn.init.zeros_(model.rel.weight)
    x = torch.randint(0, 11, (4, 4), generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        GradSampleError, match=r"model\.rel .*A gradient on sample 1's rows of the model's output alone"
    ):
        probe_rows(model, _layers(model, "emb", "qkv", "rel", "out"), (x,), {}, K=1, batch_dim=0)


class _Centred(nn.Module):
    """Mixes samples in the forward pass; every gradient of a sample's output stays on its rows."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x - x.mean(0))


def test_samples_mixed_in_the_forward_pass_are_caught_by_the_substitution() -> None:
    model = _Centred()
    with pytest.raises(
        GradSampleError, match=r"model\.fc \(Linear\).*changed the rows of other samples in its input 0"
    ):
        probe_rows(model, _layers(model, "fc"), (torch.randn(4, 3),), {}, K=1, batch_dim=0)


class _PositionTable(nn.Module):
    """BERT-style: a position table looked up once with ``arange(T)`` and broadcast over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(11, 6)
        self.pos = nn.Embedding(8, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, idx: Tensor) -> Tensor:
        return self.out(self.tok(idx) + self.pos(torch.arange(idx.shape[1])))


class _TimeMajor(nn.Module):
    """Runs time-major inside a batch-first model: at B = T every layer sees T rows."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, idx: Tensor) -> Tensor:
        return self.out(torch.tanh(self.emb(idx.t()))).transpose(0, 1)


@pytest.mark.parametrize(
    "mode,make,path",
    [
        ("ew", _PositionTable, r"model\.pos \(Embedding\)"),
        *[(mode, _TimeMajor, r"model\.emb \(Embedding\)") for mode in ("hooks", "ghost", "ew")],
    ],
)
def test_rows_that_are_positions_are_refused_when_the_counts_agree(mode: str, make: type, path: str) -> None:
    wrapped = dpnotebook.wrap_model(make(), mode)
    x = torch.randint(1, 11, (5, 5), generator=torch.Generator().manual_seed(0))  # B = T = 5
    with pytest.raises(GradSampleError, match=path + r": its rows are not the samples.*position_ids"):
        wrapped(x)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_position_table_at_b_equal_t_is_a_broadcast_in_hooks_and_ghost_mode(mode: str) -> None:
    """Refused until issue #30: its ids come from arange(T), so the tracker knows its rows are positions."""
    x = torch.randint(1, 11, (5, 5), generator=torch.Generator().manual_seed(0))  # B = T = 5
    t = torch.randn(5, 5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.manual_seed(0)
    report = audit_sensitivity(
        _PositionTable().double(),
        batch=lambda idx: (x[idx], t[idx]),
        loss=lambda m, b: (m(b[0]) * b[1]).sum(),
        num_samples=5,
        mode=mode,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )
    assert report.ok() and report.reference_gap < 1e-9


def test_the_message_names_the_layer_what_was_seen_and_the_fix() -> None:
    wrapped = dpnotebook.wrap_model(RelativeBias(), "ew")
    with pytest.raises(GradSampleError) as err:
        wrapped(torch.randint(0, 11, (4, 4), generator=torch.Generator().manual_seed(0)))
    assert str(err.value) == (
        "model.rel (Embedding): its rows are not the samples. A gradient on sample 1's rows of the model's "
        "output alone reached rows [0, 2, 3] of its output 0, which belong to other samples. Its batch dim "
        "holds 4 rows, as many as the input's B*K = 4*1, but they belong to something else (positions of a "
        "table broadcast over the batch, such as a relative-position bias looked up with a [T, T] matrix when "
        "T = B*K, or rows mixed across samples), so its per-sample gradients would not be per sample and "
        "clipping them would not bound what one sample contributes. Fix: look position tables up per row "
        "(position_ids = arange(T).expand(B, T); a relative-position bias computed per sample, [B, H, T, T]) "
        "so that every layer sees one row per sample in its batch dim, or use grad_sample_mode='functorch', "
        "which replays each sample alone."
    )


# -- what it accepts, and what it costs ------------------------------------------------------
class _Attention(nn.Module):
    """A causal ``[T, T]`` mask passed to an attention layer: at B = T its rows look like the batch's."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.attn = DPMultiheadAttention(8, 2, batch_first=True)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        h = self.emb(idx)
        h = self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return self.head(h + self.cls)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_shared_mask_and_a_class_token_at_b_equal_t_are_accepted(mode: str) -> None:
    """A mask shared by all samples is no row of theirs; the per-sample gradients match functorch mode."""
    x = torch.randint(1, 11, (4, 4), generator=torch.Generator().manual_seed(0))
    t = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = _Attention()
    report = audit_sensitivity(
        model,
        batch=lambda idx: (x[idx], t[idx]),
        loss=lambda m, b: (m(b[0]) * b[1]).sum(),
        num_samples=4,
        mode=mode,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )
    assert report.ok() and report.reference_gap < 1e-4
    assert probe_rows(model, _layers(model, "emb", "attn", "head"), (x,), {}, K=1, batch_dim=0) == "proven"


def test_a_batch_that_cannot_prove_anything_postpones_the_proof() -> None:
    """One sample: nothing can be wrong. Identical samples: only the backward check. Then one proof, once."""
    model = nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 2))
    calls: list[int] = []
    model[1].register_forward_hook(lambda m, a, o: calls.append(o.shape[0]))
    wrapped = dpnotebook.wrap_model(model, "hooks", K=2)
    same = torch.full((6, 3), 3)

    def forward(x: Tensor) -> int:
        calls.clear()
        wrapped(x).sum().backward()
        wrapped.zero_grad()
        return len(calls)

    # B = 1, K = 2: nothing to prove (the one extra pass is the tracker's discovery, on the first forward only)
    assert forward(same[:2]) == 2 and wrapped._rows_proof is None
    # B = 3 identical: pass (b) in eval mode and in training mode, then the real one
    assert forward(same) == 3 and wrapped._rows_proof == "backward only"
    assert forward(same) == 1  # still identical: (b) is not run again
    different = same.clone()
    different[4:] = 5
    # (a) and (b) in eval mode and in training mode, then the real pass
    assert forward(different) == 5 and wrapped._rows_proof == "proven"
    assert forward(different) == 1  # proven: never again


def test_the_probe_leaves_training_mode_rng_and_inputs_as_they_were() -> None:
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    model[0].eval()  # a submodule deliberately in eval mode stays so
    plain = dpnotebook.testing.clean_copy(model)
    wrapped = dpnotebook.wrap_model(model, "hooks")
    x = torch.randn(4, 3)
    kept = x.clone()
    torch.manual_seed(3)
    out = wrapped(x)
    torch.manual_seed(3)
    assert torch.equal(out, plain(x))  # the same dropout mask: the probe used no random numbers
    assert torch.equal(x, kept) and wrapped._rows_proof == "proven"
    assert model.training and model[1].training and not model[0].training


def test_functorch_mode_runs_no_probe() -> None:
    model = nn.Linear(3, 2)
    calls: list[int] = []
    model.register_forward_hook(lambda m, a, o: calls.append(1))
    dpnotebook.wrap_model(model, "functorch")(torch.randn(4, 3)).sum().backward()
    assert len(calls) == 2  # the forward pass and its replay in the backward pass


def test_equal_infinities_and_nans_are_equal_rows() -> None:
    """A layer's output may hold -inf (masked scores): the same -inf in both passes has not moved.

    On a GPU (``--device cuda``, H200 2026-11-27) this raised "Expected all tensors to be on the same
    device": the rows' gaps were written back from CPU copies into the GPU tensor, so the probe of a model
    with such an output would have failed on its first step there."""
    from dpnotebook.grad_sample._engine.provenance import _row_gaps

    a = torch.tensor([[float("-inf"), float("nan"), 1.0], [2.0, 3.0, 4.0], [float("inf"), 0.0, 0.0]])
    b = a.clone()
    b[1, 0] = 2.5
    b[2, 0] = 0.0
    assert _row_gaps(a, b, 0).tolist() == [0.0, 0.5, float("inf")]
    assert _row_gaps(a.t(), b.t(), 1).tolist() == [0.0, 0.5, float("inf")]


@pytest.mark.parametrize("mode", ["hooks", "ghost", "ew"])
def test_per_sample_gradients_do_not_pull_in_sympy(mode: str) -> None:
    """The probe's vector-Jacobian product once passed its cotangents to ``autograd.grad``, which made torch 2.13
    import sympy (42 MB resident). ``torch.optim``'s optimizers import it anyway, but the memory benchmark's
    plain step has none, so tutorial 06 counted those 42 MB as per-sample-gradient memory."""
    import subprocess
    import sys

    code = f"""
import sys, torch
import dpnotebook
from dpnotebook.models import SmallCNN
model = dpnotebook.wrap_model(SmallCNN(), {mode!r})
for _ in range(2):
    torch.nn.functional.cross_entropy(model(torch.randn(8, 1, 8, 8)), torch.randint(0, 10, (8,))).backward()
assert "sympy" not in sys.modules, "per-sample gradients imported sympy"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


class _TrainCenter(nn.Module):
    """Parameter-free, and mixes the samples only in training: eval mode hides it."""

    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(0, keepdim=True) if self.training else x


class _RunningMean(nn.Module):
    """Per-sample in its output, with a buffer a training pass updates (the probe must put it back)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.seen += x.detach().mean(0)
        return x


PLACES = {
    "before": lambda: [_TrainCenter(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)],
    "between": lambda: [nn.Linear(3, 3), _TrainCenter(), nn.Linear(3, 1)],
    "after": lambda: [nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1), _TrainCenter()],
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("mode", ["hooks", "ghost", "ew"])
def test_a_layer_that_mixes_samples_only_in_training_is_refused(mode: str, place: str) -> None:
    """Before, the probe ran in eval mode only: in hooks mode sample 0's per-sample gradient changed when
    sample 3 was removed, silently (a review, 2026-11-27)."""
    torch.manual_seed(0)
    model = dpnotebook.wrap_model(nn.Sequential(*PLACES[place]()), mode, loss_reduction="sum")
    with pytest.raises(GradSampleError, match="its rows are not the samples"):
        (model(torch.randn(4, 3)) ** 2).sum().backward()


@pytest.mark.parametrize("mode", ["hooks", "ghost", "ew"])
def test_the_training_probe_accepts_dropout_and_puts_buffers_back(mode: str) -> None:
    torch.manual_seed(0)
    dropped = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Linear(3, 1))
    (dpnotebook.wrap_model(dropped, mode, loss_reduction="sum")(torch.randn(6, 3)) ** 2).sum().backward()
    assert mode == "ghost" or dropped[0].weight.grad_sample.shape == (6, 3, 3)  # no false refusal
    net = nn.Sequential(nn.Linear(3, 3), _RunningMean(), nn.Linear(3, 1))
    x = torch.randn(6, 3)
    (dpnotebook.wrap_model(net, mode, loss_reduction="sum")(x) ** 2).sum().backward()
    once = (x @ net[0].weight.detach().T + net[0].bias.detach()).mean(0)  # the one real pass's update
    assert torch.allclose(net[1].seen, once), "the probe's passes changed the buffer"


class _RNNClassifier(nn.Module):
    """A linear embedding, a ``torch.nn`` LSTM and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = nn.Linear(3, 4), nn.LSTM(4, 5, batch_first=True), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out[:, -1])


def test_a_torch_rnn_runs_without_cudnn_while_the_probe_runs_it() -> None:
    """On a GPU cuDNN's RNN backward refuses a module in eval mode: ew mode's first step on a model with
    ``nn.LSTM`` (the mode that takes torch's RNNs) raised "cudnn RNN backward can only be called in
    training mode" (H200, 2026-11-27). And in training mode cuDNN draws a stacked RNN's dropout from a
    state of its own, which the probe's RNG rewind cannot repeat. So the probe's passes (eval and
    training) run without cuDNN; the step itself keeps the setting, which is put back afterwards."""
    torch.manual_seed(0)
    model = _RNNClassifier()
    seen: list[tuple[bool, bool]] = []
    model.rnn.register_forward_pre_hook(lambda m, args: seen.append((m.training, torch.backends.cudnn.enabled)))
    wrapped = dpnotebook.wrap_model(model, "ew")
    x, y = torch.randn(6, 7, 3), torch.randint(0, 2, (6,))
    before = torch.backends.cudnn.enabled
    nn.functional.cross_entropy(wrapped(x), y).backward()
    assert torch.backends.cudnn.enabled == before
    *probe, step = seen
    assert {training for training, _ in probe} == {False, True}  # the probe ran in both modes
    assert not any(enabled for _, enabled in probe)  # ... without cuDNN
    assert step == (True, before)  # the step itself: training, the user's setting
    assert all(p.grad_sample is not None for p in wrapped.parameters())


@pytest.mark.parametrize("mode", ["hooks", "ghost", "ew"])
def test_a_nan_sample_in_the_probed_batch_is_named_as_the_cause(mode: str) -> None:
    """A NaN input turns the probe's gradient from another sample into 0 * NaN in its own rows: the refusal
    names the sample and that cause, not a layer mixing samples (which it said before), and the fix."""
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x = torch.randn(4, 6)
    x[2, 1] = float("nan")
    with pytest.raises(GradSampleError, match=r"sample\(s\) \[2\] .* turned a gradient .* into NaN") as caught:
        torch.nn.functional.cross_entropy(dpnotebook.wrap_model(model, mode)(x), torch.tensor([0, 1, 2, 0])).backward()
    assert "rows are not the samples" not in str(caught.value) and "Fix: find those samples" in str(caught.value)
