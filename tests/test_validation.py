"""validate (mode by mode) and fix: what is flagged, what is repaired, what is refused."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook import GradSampleModule, UnsupportedModuleError
from dpnotebook.fixers import fix, group_count
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from dpnotebook.testing import dot_loss, random_target, reference_grad_samples
from dpnotebook.validation import _CHECKS, register_check, validate


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors
    yield
    torch.set_num_threads(before)


class Zoo(nn.Module):
    """One of everything that hooks mode refuses, nested."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8, scale_grad_by_freq=True)
        self.rnn = nn.Sequential(nn.LSTM(8, 6, batch_first=True, bidirectional=True), nn.GRU(12, 8, batch_first=True))
        self.elman = nn.RNN(8, 8, nonlinearity="relu", batch_first=True)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True),
            num_layers=2,
            enable_nested_tensor=False,
        )
        self.cross = nn.MultiheadAttention(8, 2, kdim=4, vdim=4, add_bias_kv=True, batch_first=True)
        self.conv = nn.Sequential(
            nn.Conv1d(8, 12, 1), nn.InstanceNorm1d(12, affine=True, track_running_stats=True), nn.BatchNorm1d(12)
        )

    def forward(self, idx: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.rnn[0](self.emb(idx))[0]
        x = self.elman(self.rnn[1](x)[0])[0]
        x = self.encoder(x)
        x = self.cross(x, memory, memory, need_weights=False)[0]
        return self.conv(torch.tanh(x).transpose(1, 2)).flatten(1)


ZOO_PATHS = [
    "model.emb",
    "model.rnn.0",
    "model.rnn.1",
    "model.elman",
    "model.encoder.layers.0.self_attn",
    "model.encoder.layers.1.self_attn",
    "model.cross",
    "model.conv.1",
    "model.conv.2",
]


def test_validate_lists_every_path_with_type_and_fix() -> None:
    problems = validate(Zoo())
    assert [p.path for p in problems] == ZOO_PATHS
    types = {p.path: p.module_type for p in problems}
    assert types["model.rnn.0"] == "LSTM" and types["model.cross"] == "MultiheadAttention"
    fixes = {p.path: p.fix for p in problems}
    assert "dpnotebook.layers.DPLSTM" in fixes["model.rnn.0"] and "dpnotebook.fix" in fixes["model.rnn.0"]
    assert "DPGRU" in fixes["model.rnn.1"] and "DPRNN" in fixes["model.elman"]
    assert "DPMultiheadAttention" in fixes["model.cross"] and "dpnotebook.fix" in fixes["model.cross"]
    assert [p.path for p in validate(Zoo(), root="zoo")][0] == "zoo.emb"  # the old keyword still works


def test_checks_depend_on_the_mode() -> None:
    # ExpandedWeights has rules for the recurrent kernels; it cannot see inside DP layers
    assert [p.path for p in validate(Zoo(), mode="ew")] == ["model.emb", "model.conv.1", "model.conv.2"]
    dp = nn.Sequential(DPLSTM(2, 3), DPMultiheadAttention(4, 2))
    assert validate(dp) == [] and [p.path for p in validate(dp, mode="ew")] == ["model.0", "model.1"]
    # vmap batches only the float32 oneDNN LSTM kernel, and cannot replay attention dropout
    rnns = nn.ModuleList([nn.LSTM(2, 3), nn.LSTM(2, 3).double(), nn.GRU(2, 3), nn.RNN(2, 3)])
    assert [p.path for p in validate(rnns, mode="functorch")] == ["model.1", "model.2", "model.3"]
    attn = nn.ModuleList([nn.MultiheadAttention(4, 2), nn.MultiheadAttention(4, 2, dropout=0.1)])
    flagged = validate(attn, mode="functorch")
    assert [p.path for p in flagged] == ["model.1"] and "dropout=0.0" in flagged[0].fix
    assert [p.path for p in validate(attn)] == ["model.0", "model.1"]


def test_wrappers_validate_in_their_own_mode() -> None:
    with pytest.raises(UnsupportedModuleError, match=r"model\.0 \(GRU\).*DPGRU.*dpnotebook\.fix"):
        GradSampleModule(nn.Sequential(nn.GRU(2, 3)))
    dpnotebook.wrap_model(nn.Sequential(nn.LSTM(2, 3)), "functorch")  # float32 LSTM: fine there
    with pytest.raises(UnsupportedModuleError, match=r"model\.0 \(GRU\)"):
        dpnotebook.wrap_model(nn.Sequential(nn.GRU(2, 3)), "functorch")


def test_register_check_for_some_modes_only() -> None:
    @register_check(modes=["functorch"])
    def no_prelu(module: nn.Module) -> tuple[str, str] | None:
        return ("PReLU is banned here.", "use ReLU.") if isinstance(module, nn.PReLU) else None

    try:
        model = nn.Sequential(nn.Linear(2, 2), nn.PReLU())
        assert validate(model) == []
        (problem,) = validate(model, mode="functorch")
        assert str(problem) == "model.1 (PReLU): PReLU is banned here. Fix: use ReLU."
    finally:
        _CHECKS.pop()


def test_fix_repairs_everything_and_keeps_outputs() -> None:
    model = Zoo().eval()
    before = copy.deepcopy(model.state_dict())
    fixed = fix(model)
    assert validate(fixed) == []
    # the original is untouched
    assert [p.path for p in validate(model)] == ZOO_PATHS
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(model.rnn[0], nn.LSTM) and model.emb.scale_grad_by_freq
    # replacements, with their settings
    assert isinstance(fixed.rnn[0], DPLSTM) and fixed.rnn[0].bidirectional and fixed.rnn[0].batch_first
    assert isinstance(fixed.rnn[1], DPGRU) and isinstance(fixed.elman, DPRNN) and fixed.elman.nonlinearity == "relu"
    assert isinstance(fixed.encoder.layers[1].self_attn, DPMultiheadAttention)
    assert fixed.cross.kdim == 4 and fixed.cross.bias_k is not None
    assert isinstance(fixed.conv[2], nn.GroupNorm) and (fixed.conv[2].num_groups, fixed.conv[2].num_channels) == (6, 12)
    assert not fixed.conv[1].track_running_stats and torch.equal(fixed.conv[1].weight, model.conv[1].weight)
    assert isinstance(fixed.conv[1], nn.InstanceNorm1d) and fixed.conv[1].affine
    assert not fixed.training
    # the recurrent and attention layers compute exactly what they did: compare the model without its norms
    model.conv, fixed.conv = nn.Identity(), nn.Identity()
    idx, memory = torch.randint(0, 10, (3, 5)), torch.randn(3, 4, 4)
    assert (model(idx, memory) - fixed(idx, memory)).abs().max() <= 1e-6


def test_fixed_model_trains_with_exact_per_sample_gradients() -> None:
    model = fix(Zoo()).double()
    idx, memory = torch.randint(0, 10, (6, 5)), torch.randn(6, 4, 4, dtype=torch.float64)
    ref = reference_grad_samples(model, [idx, memory], K=2)
    target = random_target(model, (idx, memory))
    wrapped = GradSampleModule(model, K=2, loss_reduction="sum")
    dot_loss(wrapped(idx, memory), target).backward()
    scale = max(r.abs().max() for r in ref.values())  # some true gradients are 0 (a bias before a norm)
    for name, p in model.named_parameters():
        assert (p.grad_sample - ref[name]).abs().max() <= 1e-10 * scale, name


def test_batch_norm_becomes_group_norm_with_groups_of_several_channels() -> None:
    assert [group_count(c) for c in (1, 2, 3, 4, 5, 6, 8, 12, 32, 64, 96, 100, 256)] == [
        1,
        1,
        1,
        2,
        1,
        3,
        4,
        6,
        16,
        32,
        32,
        25,
        32,
    ]
    bn = nn.BatchNorm2d(64).train()
    with torch.no_grad():
        bn.weight.uniform_(), bn.bias.uniform_()
    bn.bias.requires_grad_(False)
    gn = fix(bn)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 32 and gn.eps == bn.eps and gn.training
    assert torch.equal(gn.weight, bn.weight) and torch.equal(gn.bias, bn.bias) and not gn.bias.requires_grad
    plain = fix(nn.BatchNorm1d(6, affine=False))
    assert plain.num_groups == 3 and plain.weight is None


def test_fix_for_other_modes_changes_only_what_that_mode_needs() -> None:
    model = nn.Sequential(nn.LSTM(2, 3), nn.BatchNorm1d(3))
    fixed = fix(model, mode="ew")
    assert isinstance(fixed[0], nn.LSTM) and isinstance(fixed[1], nn.GroupNorm)
    assert isinstance(fix(nn.LSTM(2, 3)), DPLSTM)  # the root itself can be replaced


def test_refusals_name_path_type_and_fix() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.LSTM(2, 4, proj_size=2)), nn.BatchNorm1d(2))

    @register_check
    def no_prelu(module: nn.Module) -> tuple[str, str] | None:
        return ("PReLU is banned.", "use nn.ReLU.") if isinstance(module, nn.PReLU) else None

    try:
        with pytest.raises(UnsupportedModuleError) as info:
            fix(nn.Sequential(model, nn.PReLU()), root="net")
    finally:
        _CHECKS.pop()
    message = str(info.value)
    assert [p.path for p in info.value.problems] == ["net.0.1.0", "net.1"]
    assert "net.0.1.0 (LSTM)" in message and "proj_size=2" in message and "grad_sample_mode='ew'" in message
    assert "net.1 (PReLU)" in message and "No automatic repair" in message and "Fix: use nn.ReLU." in message
    assert "BatchNorm" not in message  # what could be repaired is not listed
    assert isinstance(model[2], nn.BatchNorm1d)  # and nothing was changed


# -- validate agrees with wrap_model, mode by mode -----------------------------------------------------
def _conv_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


def _frozen_bn() -> nn.Module:
    model = _conv_bn()
    model[1].requires_grad_(False)  # frozen, yet its batch statistics still mix the samples
    return model


MODEL_ZOO = {
    "batch_norm": _conv_bn,
    "frozen_batch_norm": _frozen_bn,
    "batch_norm_without_affine": lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False)),
    "lstm": lambda: nn.LSTM(3, 4),
    "lstm_float64": lambda: nn.LSTM(3, 4).double(),
    "lstm_proj_size": lambda: nn.LSTM(3, 4, proj_size=2),
    "frozen_lstm": lambda: nn.LSTM(3, 4).requires_grad_(False),
    "gru": lambda: nn.GRU(3, 4),
    "rnn": lambda: nn.RNN(3, 4),
    "attention": lambda: nn.MultiheadAttention(4, 2),
    "attention_dropout": lambda: nn.MultiheadAttention(4, 2, dropout=0.1),
    "plain_cnn": lambda: nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2)
    ),
    "dplstm": lambda: DPLSTM(3, 4),
    "dp_attention": lambda: DPMultiheadAttention(4, 2),
    "instance_norm_running_stats": lambda: nn.InstanceNorm1d(4, track_running_stats=True),
    "embedding_scale_grad_by_freq": lambda: nn.Embedding(5, 3, scale_grad_by_freq=True),
    "embedding_bag": lambda: nn.EmbeddingBag(5, 3, mode="mean"),
}


@pytest.mark.parametrize("mode", dpnotebook.available_modes())
@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_validate_is_empty_iff_wrap_model_accepts(name: str, mode: str) -> None:
    problems = validate(MODEL_ZOO[name](), mode=mode)
    try:
        dpnotebook.wrap_model(MODEL_ZOO[name](), mode)
        refused = False
    except UnsupportedModuleError:
        refused = True
    assert (problems == []) == (not refused), (name, mode, problems)


def test_validate_in_ghost_mode_flags_what_ghost_mode_refuses() -> None:
    assert [p.module_type for p in validate(nn.Sequential(nn.LSTM(3, 4)), mode="ghost")] == ["LSTM"]


@pytest.mark.parametrize("typo", ["hook", "Hooks", "ghosts", ""])
def test_validate_refuses_an_unknown_mode_and_lists_the_registered_ones(typo: str) -> None:
    modes = ", ".join(repr(m) for m in dpnotebook.available_modes())
    with pytest.raises(ValueError, match=rf"^mode={typo!r} is unknown; choose one of \[{modes}\]\.$"):
        validate(nn.Linear(2, 2), mode=typo)
