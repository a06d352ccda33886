"""prepare_fine_tuning: what is trained, what is frozen, what is kept from the pretrained model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpnotebook.datasets import split_by_classes
from dpnotebook.fine_tuning import FINE_TUNING, prepare_fine_tuning, trained_parameters
from dpnotebook.layers.lora import LoRALinear
from dpnotebook.models import MLP


@pytest.fixture
def pretrained() -> nn.Module:
    torch.manual_seed(0)
    model = MLP(in_features=8, hidden=6, num_classes=4)
    with torch.no_grad():  # "pretrained": away from any fresh initialisation
        for p in model.parameters():
            p.add_(0.5)
    return model


def trainable(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_each_way(pretrained: nn.Module) -> None:
    state = {k: v.clone() for k, v in pretrained.state_dict().items()}
    models = {how: prepare_fine_tuning(pretrained, how, num_classes=3, rank=2) for how in FINE_TUNING}
    assert all(torch.equal(v, pretrained.state_dict()[k]) for k, v in state.items()), "pretrained changed"
    assert all(p.requires_grad for p in pretrained.parameters())
    assert trainable(models["last"]) == ["net.3.weight", "net.3.bias"]
    assert trainable(models["lora"]) == ["net.1.lora_A", "net.1.lora_B", "net.3.weight", "net.3.bias"]
    assert (
        trainable(models["all"])
        == trainable(models["scratch"])
        == [n for n, _ in pretrained.named_parameters()][:2] + ["net.3.weight", "net.3.bias"]
    )
    assert isinstance(models["lora"].net[1], LoRALinear)
    assert torch.equal(models["all"].net[1].weight, pretrained.net[1].weight)
    assert not torch.equal(models["scratch"].net[1].weight, pretrained.net[1].weight)
    x = torch.randn(5, 8)
    body = pretrained.net[:3]
    assert torch.allclose(models["lora"].net[:3](x), body(x))  # B = 0: the adapter starts as the identity change
    assert torch.equal(models["last"].net[3].weight, models["all"].net[3].weight)  # same seed, same new head
    assert models["last"](x).shape == (5, 3)
    assert trained_parameters(models["last"]) == 6 * 3 + 3


def test_bad_input(pretrained: nn.Module) -> None:
    with pytest.raises(ValueError, match="how='head'"):
        prepare_fine_tuning(pretrained, "head", num_classes=2)
    with pytest.raises(ValueError, match="no nn.Linear"):
        prepare_fine_tuning(nn.Sequential(nn.Tanh()), "last", num_classes=2)


def test_split_by_classes() -> None:
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.arange(8.0), torch.tensor([5, 0, 7, 2, 5, 9, 0, 2]))
    public, private = split_by_classes(data, [0, 2])
    assert public.tensors[1].tolist() == [0, 1, 0, 1] and public.tensors[0].tolist() == [1.0, 3.0, 6.0, 7.0]
    assert private.tensors[1].tolist() == [0, 1, 0, 2]
    with pytest.raises(ValueError, match="classes=\\[3\\]"):
        split_by_classes(data, [3])


# --- fine-tuning a language model: GPT-2's Conv1D, adapters, the token loss ---------------------------------------

transformers = pytest.importorskip("transformers")  # in the lab extra (and so the test extra)

from dpnotebook.audit import audit_sensitivity  # noqa: E402
from dpnotebook.compare import compare_modes  # noqa: E402
from dpnotebook.datasets import TEXT_STYLES, TEXT_VOCABULARY, decode_text, make_template_text  # noqa: E402
from dpnotebook.fine_tuning import (  # noqa: E402
    linear_from_conv1d,
    perplexity,
    replace_conv1d,
    token_cross_entropy,
)
from dpnotebook.models import Logits, tiny_gpt2  # noqa: E402

V = len(TEXT_VOCABULARY)


@pytest.fixture
def gpt2() -> Logits:
    model = tiny_gpt2(V, length=8, width=16, layers=1, seed=0)
    with torch.no_grad():  # away from the initialisation's small weights: larger, more varied gradients
        for p in model.parameters():
            p.mul_(3.0)
    return model


def test_replace_conv1d_computes_the_same(gpt2: Logits) -> None:
    Conv1D = transformers.pytorch_utils.Conv1D
    converted = copy.deepcopy(gpt2)
    names = replace_conv1d(converted)
    assert names == [f"model.transformer.h.0.{n}" for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert not any(isinstance(m, Conv1D) for m in converted.modules())
    conv = gpt2.get_submodule(names[2])
    linear = converted.get_submodule(names[2])
    assert isinstance(linear, nn.Linear) and (linear.in_features, linear.out_features) == (16, 64)
    assert torch.equal(linear.weight, conv.weight.T) and torch.equal(linear.bias, conv.bias)
    tokens = torch.randint(0, V, (5, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(converted(tokens), gpt2(tokens), rtol=1e-5, atol=1e-5)
    assert replace_conv1d(converted) == []  # nothing left to replace
    with pytest.raises(TypeError, match="layer=Linear is invalid"):
        linear_from_conv1d(nn.Linear(2, 2))


def test_lora_on_gpt2_keeps_the_head_and_starts_where_the_model_was(gpt2: Logits) -> None:
    model = prepare_fine_tuning(gpt2, "lora", num_classes=None, rank=2)
    assert isinstance(gpt2.model.transformer.h[0].mlp.c_fc, transformers.pytorch_utils.Conv1D)  # the original stays
    block = model.model.transformer.h[0]
    adapted = [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj]
    assert all(isinstance(m, LoRALinear) for m in adapted)
    layers = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    assert trainable(model) == [f"model.transformer.h.0.{n}.lora_{ab}" for n in layers for ab in "AB"]
    assert trained_parameters(model) == sum(2 * (m.in_features + m.out_features) for m in adapted)
    assert model.model.lm_head.weight is model.model.transformer.wte.weight  # the tied head is kept, frozen
    tokens = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(tokens), gpt2(tokens), rtol=1e-5, atol=1e-5)
    last = prepare_fine_tuning(gpt2, "last", num_classes=None)
    assert trainable(last) == ["model.transformer.wte.weight"]  # the head, tied to the token table
    with pytest.raises(ValueError, match="num_classes=0 is invalid"):
        prepare_fine_tuning(gpt2, "lora", num_classes=0)


def _lora(gpt2: Logits) -> nn.Module:
    model = prepare_fine_tuning(gpt2, "lora", num_classes=None, rank=2)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # B != 0, so A's per-sample gradients are not zero
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(generator=gen)
    return model


def test_lora_gpt2_per_sample_gradients_match_the_oracle(gpt2: Logits) -> None:
    gen = torch.Generator().manual_seed(3)
    tokens, targets = torch.randint(0, V, (4, 8), generator=gen), torch.randint(0, V, (4, 8), generator=gen)
    rows = compare_modes(_lora(gpt2), tokens, targets, token_cross_entropy, modes=["hooks", "ghost", "functorch"],
                         repeats=1)  # fmt: skip
    assert [(r.mode, r.agrees, r.error) for r in rows] == [
        (mode, True, "") for mode in ("oracle", "hooks", "ghost", "functorch")
    ]


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functorch"])
def test_lora_gpt2_sensitivity_on_adversarial_records(gpt2: Logits, mode: str) -> None:
    """One record moves the clipped sum by at most C: repeated words, an unseen word, duplicates, a random block."""
    gen = torch.Generator().manual_seed(4)
    unseen = TEXT_VOCABULARY.index("clinic")
    tokens = torch.stack([
        torch.full((8,), 1),                      # one word over and over
        torch.full((8,), unseen),                 # a word the public text never has
        torch.randint(0, V, (8,), generator=gen),
        torch.randint(0, V, (8,), generator=gen),
        torch.randint(0, V, (8,), generator=gen),
    ])  # fmt: skip
    tokens[4] = tokens[3]  # two identical records
    targets = torch.roll(tokens, -1, dims=1)
    targets[1] = 0  # targets the model is far from
    for C in (1e-3, 1e3):  # every record clipped / none clipped
        report = audit_sensitivity(
            _lora(gpt2),
            batch=lambda idx: (tokens[idx], targets[idx]),
            loss=lambda m, b: token_cross_entropy(m(b[0]), b[1]),
            num_samples=5,
            mode=mode,
            max_grad_norm=C,
        )
        assert not report.nonfinite and report.max_ratio <= 1 + 1e-4, (C, report.ratios)
        assert report.reference_gap is not None and report.reference_gap < 1e-3


def test_make_template_text() -> None:
    public, private = make_template_text("public", 200, seed=0), make_template_text("private", 200, seed=0)
    assert public.tensors[0].shape == (200, 16) and public.tensors[0].dtype == torch.int64
    assert torch.equal(public.tensors[0][:, 1:], public.tensors[1][:, :-1])
    assert torch.equal(public.tensors[0], make_template_text("public", 200, seed=0).tensors[0])  # seeded
    seen = {TEXT_VOCABULARY[i] for i in public.tensors[0].unique().tolist()}
    private_words = {TEXT_VOCABULARY[i] for i in private.tensors[0].unique().tolist()}
    assert {"anna", "clinic", "doctor"} <= private_words - seen  # a shifted distribution: words public text lacks
    assert decode_text(public.tensors[0][0]).split()[-1] in TEXT_VOCABULARY and set(TEXT_STYLES) == {
        "public",
        "private",
    }
    with pytest.raises(ValueError, match="style='secret' is invalid"):
        make_template_text("secret", 2)
    with pytest.raises(ValueError, match="length=0 is invalid"):
        make_template_text("public", 2, length=0)


def test_perplexity_of_a_uniform_guess_is_the_vocabulary_size() -> None:
    from torch.utils.data import DataLoader

    class Uniform(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(V))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.bias.expand(*tokens.shape, V)

    data = make_template_text("private", 10, length=5)
    assert perplexity(Uniform(), DataLoader(data, batch_size=4)) == pytest.approx(V)


def test_tiny_gpt2_without_transformers_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(
        ImportError, match=r"tiny_transformer\('gpt2'\) needs the transformers package: pip install transformers"
    ):
        tiny_gpt2(10, length=4)


def test_logits_calls_the_model_as_a_user_would() -> None:
    seen = []

    class Recorder(nn.Module):
        def forward(self, **kwargs: torch.Tensor) -> object:
            seen.append(kwargs)
            return type("Out", (), {"logits": kwargs["input_ids"].float()[..., None]})()

    out = Logits(Recorder())(torch.zeros(3, 5, dtype=torch.long))
    assert out.shape == (3, 5, 1) and list(seen[0]) == ["input_ids"]


def test_a_trained_gpt2_position_table_gets_per_sample_gradients_as_called() -> None:
    """No per-row position_ids: the table looked up once for the batch is followed to where it meets it."""
    from dpnotebook import wrap_model

    model = tiny_gpt2(12, length=6, width=8, layers=1).double()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 12, (3, 6), generator=torch.Generator().manual_seed(0))
    wrapped = wrap_model(model, "hooks")  # loss_reduction="mean": grad_sample[i] is sample i's own gradient
    token_cross_entropy(wrapped(tokens), tokens).backward()
    table = model.model.transformer.wpe.weight
    reference_table = reference.model.transformer.wpe.weight
    assert table.grad_sample.shape == (3, *table.shape)
    for i in range(3):
        reference.zero_grad()
        token_cross_entropy(reference(tokens[i : i + 1]), tokens[i : i + 1]).backward()
        assert reference_table.grad is not None and reference_table.grad.abs().sum() > 0
        torch.testing.assert_close(table.grad_sample[i], reference_table.grad, rtol=1e-9, atol=1e-12)
