"""DPMultiheadAttention against nn.MultiheadAttention: layout, outputs, masks, transformers, per-sample gradients."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpnotebook import GradSampleModule
from dpnotebook.layers import DPMultiheadAttention
from dpnotebook.modes import wrap_model
from dpnotebook.testing import dot_loss, random_target, reference_grad_samples

E, H = 8, 2
OPTIONS = [
    dict(bias=b, add_bias_kv=kv, add_zero_attn=z, kdim=kd, vdim=kd)
    for b, kv, z, kd in itertools.product([True, False], [False, True], [False, True], [None, 3])
]


def pair(dtype: torch.dtype = torch.float64, **options) -> tuple[nn.MultiheadAttention, DPMultiheadAttention]:
    torch.manual_seed(1)
    native = nn.MultiheadAttention(E, H, **options).to(dtype)
    torch.manual_seed(1)
    dp = DPMultiheadAttention(E, H, **options).to(dtype)
    return native, dp


def test_same_names_state_dict_and_initialisation() -> None:
    for options in OPTIONS:
        native, dp = pair(**options)
        assert [n for n, _ in dp.named_parameters()] == [n for n, _ in native.named_parameters()]
        nsd, dsd = native.state_dict(), dp.state_dict()
        assert list(dsd) == list(nsd)
        assert all(torch.equal(nsd[k], dsd[k]) for k in nsd)
        for attr in ("embed_dim", "kdim", "vdim", "num_heads", "head_dim", "_qkv_same_embed_dim", "add_zero_attn"):
            assert getattr(dp, attr) == getattr(native, attr)


def masks(N: int, L: int, S: int, dtype: torch.dtype) -> list[dict]:
    kpm = torch.rand(N, S) < 0.3
    kpm[:, 0] = False  # no fully masked row (NaN in both)
    am = torch.rand(L, S) < 0.3
    am[:, 0] = False
    cases = [
        {},
        {"key_padding_mask": kpm},
        {"key_padding_mask": torch.randn(N, S, dtype=dtype)},
        {"attn_mask": am},
        {"attn_mask": am, "key_padding_mask": kpm},
        {"attn_mask": torch.randn(N * H, L, S, dtype=dtype)},
    ]
    if L == S:
        causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=dtype)
        cases += [
            {"attn_mask": causal, "is_causal": True},
            {"attn_mask": causal, "is_causal": True, "key_padding_mask": kpm},
        ]
    return cases


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch_first", [False, True])
def test_outputs_match_across_options_masks_and_inputs(dtype: torch.dtype, batch_first: bool) -> None:
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    N, L, S = 3, 4, 5
    for options in OPTIONS:
        native, dp = pair(dtype, batch_first=batch_first, **options)
        native.eval(), dp.eval()
        kdim = options["kdim"] or E

        def make(n: int, s: int, e: int) -> torch.Tensor:
            return torch.randn(n, s, e, dtype=dtype) if batch_first else torch.randn(s, n, e, dtype=dtype)

        q, k, v = make(N, L, E), make(N, S, kdim), make(N, S, kdim)
        calls = [(q, k, v), (q, k, k)] + ([(q, q, q)] if kdim == E else [])
        for inputs in calls:
            S_ = inputs[1].shape[1 if batch_first else 0]
            for kw, need, avg in itertools.product(masks(N, L, S_, dtype), [True, False], [True, False]):
                a = native(*inputs, need_weights=need, average_attn_weights=avg, **kw)
                b = dp(*inputs, need_weights=need, average_attn_weights=avg, **kw)
                assert (a[0] - b[0]).abs().max().item() <= tol, (options, kw, need)
                assert (a[1] is None) == (b[1] is None)
                if a[1] is not None:
                    assert a[1].shape == b[1].shape and (a[1] - b[1]).abs().max().item() <= tol


def test_unbatched_inputs_and_both_load_directions() -> None:
    native, dp = pair(add_bias_kv=True)
    torch.manual_seed(3)
    other = nn.MultiheadAttention(E, H, add_bias_kv=True).double()
    dp.load_state_dict(other.state_dict())
    native.load_state_dict(dp.state_dict())
    x = torch.randn(4, E, dtype=torch.float64)
    for kw in ({}, {"key_padding_mask": torch.tensor([False, True, False, False])}, {"average_attn_weights": False}):
        for ref in (native, other):
            a, b = ref(x, x, x, **kw), dp(x, x, x, **kw)
            assert a[0].shape == b[0].shape == (4, E) and a[1].shape == b[1].shape
            assert (a[0] - b[0]).abs().max() <= 1e-12 and (a[1] - b[1]).abs().max() <= 1e-12


@pytest.mark.parametrize("batch_first", [True, False])
def test_inside_transformer_encoder_layer(batch_first: bool) -> None:
    native = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=batch_first).double()
    dp = copy.deepcopy(native)
    dp.self_attn = DPMultiheadAttention(E, H, batch_first=batch_first).double()
    dp.self_attn.load_state_dict(native.self_attn.state_dict())
    x = torch.randn(3, 5, E, dtype=torch.float64)
    x = x if batch_first else x.transpose(0, 1)
    kpm = torch.tensor([[False] * 5, [False] * 4 + [True], [False] * 2 + [True] * 3])
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    for training in (True, False):
        native.train(training), dp.train(training)
        for kw in ({}, {"src_mask": causal, "is_causal": True}, {"src_key_padding_mask": kpm}):
            assert (native(x, **kw) - dp(x, **kw)).abs().max() <= 1e-12
    with torch.no_grad():  # eval + no_grad: PyTorch's fused fast path reads DP's parameters directly
        assert (native(x) - dp(x)).abs().max() <= 1e-12
    stack = nn.TransformerEncoder(dp, num_layers=2, enable_nested_tensor=False)
    assert stack(x, src_key_padding_mask=kpm).shape == x.shape


class Attends(nn.Module):
    def __init__(self, mha: DPMultiheadAttention, inputs: str, need_weights: bool) -> None:
        super().__init__()
        self.mha, self.inputs, self.need_weights = mha, inputs, need_weights

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        k, v = {"self": (x, x), "kv": (y, y), "qkv": (y, 2 * y)}[self.inputs]
        return self.mha(x if self.inputs != "self" else x, k, v, need_weights=self.need_weights)[0]


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap over scaled_dot_product_attention
@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    options=st.sampled_from(OPTIONS),
    inputs=st.sampled_from(["self", "kv", "qkv"]),
    K=st.sampled_from([1, 3]),
    reduction=st.sampled_from(["mean", "sum"]),
    batch_first=st.booleans(),
    need_weights=st.booleans(),
)
def test_per_sample_gradients_match_the_oracle(
    options: dict, inputs: str, K: int, reduction: str, batch_first: bool, need_weights: bool
) -> None:
    if options["kdim"] is not None and inputs == "self":
        inputs = "kv"
    torch.manual_seed(0)
    model = Attends(DPMultiheadAttention(E, H, batch_first=batch_first, **options).double(), inputs, need_weights)
    B, L, S = 2, 3, 4
    x = torch.randn(B * K, L, E, dtype=torch.float64)
    y = torch.randn(B * K, S, options["kdim"] or E, dtype=torch.float64)
    if not batch_first:
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    ref = reference_grad_samples(model, [x, y], K=K, batch_first=batch_first)
    target = random_target(model, (x, y))
    for mode in ("hooks", "functorch"):
        wrapped = wrap_model(model, mode, K=K, batch_first=batch_first, loss_reduction=reduction)
        loss = dot_loss(wrapped(x, y), target)
        (loss / (B * K) if reduction == "mean" else loss).backward()
        for name, p in model.named_parameters():
            err = (p.grad_sample - ref[name]).abs().max() / ref[name].abs().max()
            assert err <= 1e-10, (mode, name, err.item())
        wrapped.to_standard_module()
        model.zero_grad()


def test_attention_dropout_in_training_keeps_hooks_mode_exact() -> None:
    """With dropout the oracle cannot replay the masks, but sum of per-sample grads must equal .grad."""
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.3, batch_first=True)
    layer.self_attn = DPMultiheadAttention(E, H, dropout=0.3, batch_first=True)
    wrapped = GradSampleModule(layer, loss_reduction="sum")
    wrapped(torch.randn(4, 5, E)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad_sample.shape == (4, *p.shape)
        torch.testing.assert_close(p.grad_sample.sum(0), p.grad, rtol=1e-4, atol=1e-5, msg=name)
    units = dict(wrapped.units)
    assert units["model.self_attn.in_proj"] == "in_projection_grad_sampler"
    assert units["model.self_attn.out_proj"] == "linear_grad_sampler"


def test_shared_parameters_survive_replacement_and_conversion() -> None:
    native, dp = pair(add_bias_kv=True, kdim=3, vdim=3)
    dp.load_state_dict(native.state_dict(), assign=True)
    dp = dp.float()
    assert dp.q_in_proj.weight is dp.q_proj_weight and dp.v_in_proj.bias is dp.in_proj_bias
    assert dp.append_bias_k.bias is dp.bias_k and dp.bias_k.dtype == torch.float32
    assert len(list(dp.parameters())) == len(list(native.parameters()))
