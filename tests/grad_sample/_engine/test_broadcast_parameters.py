"""Batch-free parameters meeting the batch, in hooks and ghost mode (issue #30, items 1-3).

Position tables looked up once with ``[1, T]`` ids (BERT, DistilBERT, GPT-2), T5's
relative attention bias, a ViT class token and position embedding held by containers,
a ConvNeXt layer scale: per-sample gradients (hooks) and norms and clipped sums
(ghost) against the float64 oracle, the units each model gets, and the audit.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from dpnotebook import GradSampleModule
from dpnotebook.audit import audit_sensitivity
from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample import GhostGradSampleModule
from dpnotebook.layers import DPMultiheadAttention
from dpnotebook.testing import dot_loss, random_target, reference_grad_samples

transformers = pytest.importorskip("transformers")


# -- the models ------------------------------------------------------------------------------
class HF(nn.Module):
    """A Hugging Face model returning its logits (T5 is given ``decoder_input_ids``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, ids: Tensor, dec: Tensor | None = None) -> Tensor:
        if dec is not None:
            return self.m(input_ids=ids, decoder_input_ids=dec).logits
        return self.m(input_ids=ids).logits


def _hf(kind: str) -> nn.Module:
    t = transformers
    torch.manual_seed(0)
    if kind == "bert":
        cfg = t.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
        )  # fmt: skip
        return HF(t.BertForSequenceClassification(cfg))
    if kind == "distilbert":
        cfg = t.DistilBertConfig(
            vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=32, dropout=0.0,
            attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3,
        )  # fmt: skip
        return HF(t.DistilBertForSequenceClassification(cfg))
    if kind == "gpt2":
        cfg = t.GPT2Config(
            vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return HF(t.GPT2LMHeadModel(cfg))
    if kind == "t5":
        cfg = t.T5Config(
            vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
            decoder_start_token_id=0,
        )  # fmt: skip
        return HF(t.T5ForConditionalGeneration(cfg))
    assert kind == "llama"
    cfg = t.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    return HF(t.LlamaForCausalLM(cfg))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = DPMultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    """Holds the position embedding and all the blocks (as torchvision's ViT encoder does)."""

    def __init__(self, d: int, T: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(0.1 * torch.randn(1, T, d))
        self.layers = nn.Sequential(Block(d), Block(d))
        self.ln = nn.LayerNorm(d)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(self.layers(x + self.pos_embedding))


class TinyViT(nn.Module):
    """A class token on the root, ``expand``-ed and ``cat``-ed, as torchvision's ``VisionTransformer``."""

    def __init__(self, d: int = 8, patch: int = 2, image: int = 4) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, patch, stride=patch)
        self.class_token = nn.Parameter(0.1 * torch.randn(1, 1, d))
        self.encoder = Encoder(d, (image // patch) ** 2 + 1)
        self.heads = nn.Linear(d, 3)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


class Permute(nn.Module):
    def __init__(self, *dims: int) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: Tensor) -> Tensor:
        return x.permute(*self.dims)


class CNBlock(nn.Module):
    """torchvision's ConvNeXt block: channels-last LayerNorm, a ``[C, 1, 1]`` layer scale held by the block."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(C, C, 3, padding=1, groups=C), Permute(0, 2, 3, 1), nn.LayerNorm(C),
            nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C), Permute(0, 3, 1, 2),
        )  # fmt: skip
        self.layer_scale = nn.Parameter(torch.full((C, 1, 1), 0.5))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.layer_scale * self.block(x)


def _convnext() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 2, stride=2), CNBlock(4), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return TinyViT()


MODELS = ["bert", "distilbert", "gpt2", "t5", "llama", "vit", "convnext"]


def _model(kind: str) -> nn.Module:
    return _vit() if kind == "vit" else _convnext() if kind == "convnext" else _hf(kind)


def _inputs(kind: str, rows: int, T: int = 5, dtype: torch.dtype = torch.float64) -> tuple:
    gen = torch.Generator().manual_seed(1)
    if kind in ("vit", "convnext"):
        return (torch.randn(rows, 3, 4, 4, generator=gen, dtype=dtype),)
    ids = torch.randint(0, 50, (rows, T), generator=gen)
    return (ids, torch.randint(0, 50, (rows, T), generator=gen)) if kind == "t5" else (ids,)


def _oracle(model: nn.Module, inputs: tuple, K: int) -> tuple[dict[str, Tensor], Tensor]:
    target = random_target(model, inputs)
    return reference_grad_samples(model, inputs, target=target, K=K), target


def _backward(wrapped: nn.Module, inputs: tuple, target: Tensor) -> None:
    out = wrapped(*inputs)
    (dot_loss(out, target.to(out.dtype)) / target.shape[0]).backward()


def _tol(kind: str) -> dict:
    """T5's and Llama's RMS norms (and Llama's rotary tables) work in float32 whatever the model's dtype."""
    return dict(rtol=1e-5, atol=1e-5) if kind in ("t5", "llama") else dict(rtol=1e-7, atol=1e-9)


# -- hooks: per-sample gradients -----------------------------------------------------------
@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("kind", MODELS)
def test_hooks_per_sample_gradients_match_the_oracle(kind: str, K: int) -> None:
    model = _model(kind).double()
    inputs = _inputs(kind, 3 * K)
    oracle, target = _oracle(model, inputs, K)
    wrapped = GradSampleModule(model, K=K)
    _backward(wrapped, inputs, target)
    for name, p in model.named_parameters():
        assert p.grad_sample.shape == (3, *p.shape), name
        torch.testing.assert_close(p.grad_sample, oracle[name], **_tol(kind), msg=name)
    paths = [path for path, how in wrapped.units if how == "torch.func"]
    assert "model" not in paths and not any(path == "model.1" for path in paths if kind == "convnext")
    if kind in ("vit", "convnext"):
        assert paths == [], wrapped.units  # every layer has a sampler; the container's parameters are broadcast


# -- ghost: norms and clipped sums ---------------------------------------------------------
@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("kind", MODELS)
def test_ghost_norms_and_clipped_sum_match_the_oracle(kind: str, K: int) -> None:
    model = _model(kind).double()
    inputs = _inputs(kind, 3 * K)
    oracle, target = _oracle(model, inputs, K)
    wrapped = GhostGradSampleModule(model, K=K)
    _backward(wrapped, inputs, target)
    params = dict(model.named_parameters())
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in oracle.values()]).sum(0).sqrt()
    torch.testing.assert_close(wrapped.per_sample_norms(), norms, **_tol(kind))
    clip = (0.05 / norms).clamp(max=1.0)
    sums = wrapped.weighted_sums(clip)
    for name, g in oracle.items():
        torch.testing.assert_close(sums[params[name]], torch.einsum("b,b...->...", clip, g), **_tol(kind), msg=name)
    ghosted = [path for path, how in wrapped.units if how == "ghost"]
    assert "model" not in [path for path, how in wrapped.units if how == "torch.func"]
    if kind in ("vit", "convnext"):
        assert not [u for u in wrapped.units if u[1] == "torch.func"] and len(ghosted) >= 5, wrapped.units


def test_units_of_the_vit_have_no_whole_model_unit() -> None:
    wrapped = GradSampleModule(_vit())
    wrapped(*_inputs("vit", 2, dtype=torch.float32)).sum().backward()
    assert ("model.class_token", "broadcast") in wrapped.units
    assert ("model.encoder.pos_embedding", "broadcast") in wrapped.units
    assert all(how != "torch.func" for _, how in wrapped.units)


def test_gpt2_keeps_its_tied_embeddings_in_ghost_mode() -> None:
    model = _hf("gpt2")
    wrapped = GhostGradSampleModule(model)
    wrapped(*_inputs("gpt2", 2)).sum().backward()
    assert model.m.lm_head.weight is model.m.transformer.wte.weight
    assert dict(wrapped.units)["model.m.transformer.wte"] == "embedding_grad_sampler"
    assert ("model.m.transformer.wpe.weight", "broadcast") in wrapped.units


# -- T5 at B = T: the bias is known to be batch-free ------------------------------------
@pytest.mark.parametrize("mode", [GradSampleModule, GhostGradSampleModule])
def test_t5_at_b_equal_t_is_handled_by_provenance_not_by_a_count(mode: type) -> None:
    model = _hf("t5").double()
    inputs = _inputs("t5", 5, T=5)  # B = T = 5: the bucket matrix has as many rows as the batch
    oracle, target = _oracle(model, inputs, 1)
    wrapped = mode(model)
    _backward(wrapped, inputs, target)
    name = "m.encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    assert any(path == "model." + name for path, _ in wrapped.units)
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in oracle.values()]).sum(0).sqrt()
    if mode is GradSampleModule:
        torch.testing.assert_close(model.get_parameter(name).grad_sample, oracle[name], **_tol("t5"))
    else:
        torch.testing.assert_close(wrapped.per_sample_norms(), norms, **_tol("t5"))


# -- what is not recognised, and what the probe refuses ----------------------------------------
class MatmulHolder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x) @ self.w


@pytest.mark.parametrize("mode", [GradSampleModule, GhostGradSampleModule])
def test_an_unrecognised_use_falls_back_to_the_smallest_module(mode: type) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), MatmulHolder(), nn.Linear(4, 2)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    oracle, target = _oracle(model, (x,), 1)
    wrapped = mode(model)
    _backward(wrapped, (x,), target)
    units = dict(wrapped.units)
    assert units["model.1"] == "torch.func" and "model" not in units and "model.1.fc" not in units
    if mode is GradSampleModule:
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad_sample, oracle[name], rtol=1e-7, atol=1e-9)


class Transposed(nn.Module):
    """``gamma`` (``[T, 1]``) scales the rows of ``x.t()``: positions, not samples."""

    def __init__(self, T: int) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, T)[:, None])

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x).sum(-1)  # [B, T]
        return (h.t() * self.gamma).t()


@pytest.mark.parametrize("mode", [GradSampleModule, GhostGradSampleModule])
def test_an_input_dependent_meeting_point_is_refused_by_the_probe(mode: type) -> None:
    """At B = T the rows of ``x.t()`` have the batch's count; the probe finds they are positions."""
    model = Transposed(4)
    with pytest.raises(GradSampleError, match=r"the meeting point model: mul .*its rows are not the samples"):
        mode(model)(torch.randn(4, 4, 3)).sum().backward()


# -- the audit: sensitivity <= C on adversarial records ------------------------------------------
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("kind", ["vit", "bert"])
def test_sensitivity_audit_on_adversarial_records(kind: str, mode: str) -> None:
    B = 4
    (x,) = _inputs(kind, B, dtype=torch.float32)
    if kind == "vit":
        x[0] *= 1e3  # one record far larger than the others
    else:
        x[0] = 49  # one record of a single repeated token
    model = _model(kind)
    out = model(x[:1])
    t = torch.randn(B, *out.shape[1:], generator=torch.Generator().manual_seed(2))
    t[0] *= 1e3
    report = audit_sensitivity(
        model,
        batch=lambda idx: (x[idx], t[idx]),
        loss=lambda m, b: (m(b[0]) * b[1]).sum(),
        num_samples=B,
        mode=mode,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )
    assert report.ok() and report.max_ratio <= 1 + 1e-6 and report.reference_gap < 1e-4, report


def test_ew_mode_still_refuses_and_names_the_mode_to_use() -> None:
    from dpnotebook.grad_sample._engine.ew import GradSampleModuleExpandedWeights

    with pytest.raises(GradSampleError, match=r"grad_sample_mode='ew': .*Fix: use grad_sample_mode='hooks' or 'ghost'"):
        GradSampleModuleExpandedWeights(_hf("bert"))(*_inputs("bert", 3)).sum().backward()


class TwoPaths(nn.Module):
    """Meets the batch in a mul on the first forward pass, in a matmul when ``late`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.w = nn.Parameter(torch.randn(4, 4))
        self.late = False

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        return h @ self.w if self.late else h * self.w[0]


def test_an_unrecognised_use_the_discovery_did_not_see_is_refused_by_name() -> None:
    model = TwoPaths()
    wrapped = GradSampleModule(model)
    wrapped(torch.randn(4, 3)).sum().backward()
    assert ("model.w", "broadcast") in wrapped.units
    wrapped.zero_grad()
    model.late = True
    with pytest.raises(
        GradSampleError, match=r"model\.w meet\(s\) the batch in matmul inside model, .*register_grad_sampler"
    ):
        wrapped(torch.randn(4, 3))
