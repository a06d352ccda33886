"""The networks the benchmarks measure (same shapes as the Opacus baseline we compare with).

Each model comes with a function that makes a batch for it (:data:`MODELS`),
so that the suite, the tests and a notebook build the very same thing:

>>> import torch
>>> model, x, y = build("MLP", batch=2)
>>> model(x).shape, y.shape
(torch.Size([2, 10]), torch.Size([2]))

The recurrent and attention layers are constructor arguments, so that the same
network can be built with ``dpnotebook.layers`` (hooks and ghost modes need them),
with ``torch.nn`` or with Opacus' own DP layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.layers import DPLSTM, DPMultiheadAttention

VOCAB, SEQ_LEN, NUM_CLASSES = 10_000, 64, 10


class SampleConvNet(nn.Module):
    """The MNIST network of the Opacus README: two convolutions, two linear layers.

    >>> import torch
    >>> SampleConvNet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 1)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class MLP(nn.Sequential):
    """784-512-512-10 with ReLU, on flattened 28x28 images.

    >>> MLP()(torch.zeros(2, 784)).shape
    torch.Size([2, 10])
    """

    def __init__(self) -> None:
        super().__init__(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


class TextTransformer(nn.Module):
    """Embedding 10000x128, one encoder layer (4 heads, feed-forward 256), mean pool, classifier.

    Args:
        attention: the attention class put into ``nn.TransformerEncoderLayer.self_attn``
            (``DPMultiheadAttention`` by default; ``nn.MultiheadAttention`` for the native model).

    >>> TextTransformer()(torch.zeros(2, 64, dtype=torch.long)).shape
    torch.Size([2, 10])
    """

    def __init__(self, attention: Callable[..., nn.Module] = DPMultiheadAttention, d: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, d)
        self.encoder = nn.TransformerEncoderLayer(d, 4, dim_feedforward=256, dropout=0.0, batch_first=True)
        # torch types self_attn as nn.MultiheadAttention, but the layer only calls it (and reads the
        # attributes DPMultiheadAttention has too), so another attention module works
        self.encoder.self_attn = attention(d, 4, batch_first=True)  # type: ignore[assignment]
        self.fc = nn.Linear(d, NUM_CLASSES)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.fc(self.encoder(self.embedding(tokens)).mean(1))


class LSTMClassifier(nn.Module):
    """Embedding 10000x64, LSTM 64->128, classifier on the last hidden state.

    Args:
        lstm: the LSTM class (``DPLSTM`` by default; ``nn.LSTM`` for the native model).

    >>> LSTMClassifier()(torch.zeros(2, 64, dtype=torch.long)).shape
    torch.Size([2, 10])
    """

    def __init__(self, lstm: Callable[..., nn.Module] = DPLSTM) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 64)
        self.lstm = lstm(64, 128, batch_first=True)
        self.fc = nn.Linear(128, NUM_CLASSES)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.fc(out[:, -1])


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm, and a 1x1 shortcut when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(groups, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class SmallResNetGN(nn.Module):
    """A small ResNet for 3x32x32 images: stem 32, stages 32/64/128 (strides 1/2/2), GroupNorm.

    >>> SmallResNetGN()(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    def __init__(self, widths: tuple[int, int, int] = (32, 64, 128)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.GroupNorm(8, widths[0]), nn.ReLU())
        blocks, c = [], widths[0]
        for w, s in zip(widths, (1, 2, 2), strict=True):
            blocks.append(BasicBlock(c, w, s))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


@dataclass(frozen=True)
class BenchModel:
    """A benchmark model: how to build it (``flavour`` picks the layer implementations) and its data.

    Attributes:
        make: ``make(flavour) -> nn.Module``; flavour ``"dp"`` (dpnotebook layers),
            ``"native"`` (torch.nn layers) or ``"opacus"`` (Opacus' DP layers).
        data: ``data(rows, generator) -> (inputs, targets)``.
    """

    make: Callable[[str], nn.Module]
    data: Callable[[int, torch.Generator], tuple[Tensor, Tensor]]


def _images(*shape: int) -> Callable[[int, torch.Generator], tuple[Tensor, Tensor]]:
    def data(rows: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return torch.randn(rows, *shape, generator=gen), torch.randint(0, NUM_CLASSES, (rows,), generator=gen)

    return data


def _tokens(rows: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    return torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen), torch.randint(
        0, NUM_CLASSES, (rows,), generator=gen
    )


def _attention(flavour: str) -> Callable[..., nn.Module]:
    if flavour == "native":
        return nn.MultiheadAttention
    if flavour == "opacus":
        from opacus.layers import DPMultiheadAttention as OpacusMHA

        return OpacusMHA
    return DPMultiheadAttention


def _lstm(flavour: str) -> Callable[..., nn.Module]:
    if flavour == "native":
        return nn.LSTM
    if flavour == "opacus":
        from opacus.layers import DPLSTM as OpacusLSTM

        return OpacusLSTM
    return DPLSTM


MODELS: dict[str, BenchModel] = {
    "SampleConvNet": BenchModel(lambda f: SampleConvNet(), _images(1, 28, 28)),
    "MLP": BenchModel(lambda f: MLP(), _images(784)),
    "TextTransformer": BenchModel(lambda f: TextTransformer(_attention(f)), _tokens),
    "LSTMClassifier": BenchModel(lambda f: LSTMClassifier(_lstm(f)), _tokens),
    "SmallResNetGN": BenchModel(lambda f: SmallResNetGN(), _images(3, 32, 32)),
}


# ---------------------------------------------------------------- Hugging Face transformers at CPU-realistic shapes

#: Vocabulary of the Hugging Face benchmark models (their LM heads are ``HF_VOCAB x HF_HIDDEN``).
HF_VOCAB, HF_HIDDEN = 1000, 128


class TokenLogits(nn.Module):
    """A Hugging Face model called on token ids as a user calls it; logits ready for cross-entropy.

    No ``position_ids`` are passed: the position table is looked up once with ``[1, T]`` ids and
    broadcast over the batch, and hooks and ghost mode follow it to where it meets the batch
    (:mod:`dpnotebook.grad_sample._engine.broadcast`), so the benchmark times that path too.
    A language model's logits ``[B, T, V]`` come back as ``[B, V, T]``, so that
    ``F.cross_entropy(logits, tokens)`` is the mean over every position.

    Args:
        hf: the Hugging Face model.
        seq2seq: an encoder-decoder (T5): the decoder reads the tokens shifted right.
    """

    def __init__(self, hf: nn.Module, seq2seq: bool = False) -> None:
        super().__init__()
        self.hf, self.seq2seq = hf, seq2seq

    def forward(self, tokens: Tensor) -> Tensor:
        if self.seq2seq:
            decoder = torch.cat([tokens.new_zeros(tokens.shape[0], 1), tokens[:, :-1]], 1)
            logits = self.hf(input_ids=tokens, decoder_input_ids=decoder).logits
        else:
            logits = self.hf(input_ids=tokens).logits
        return logits.transpose(1, 2) if logits.dim() == 3 else logits


def _hf(kind: str) -> nn.Module:
    """Two layers, hidden ``HF_HIDDEN``, 4 heads, feed-forward ``2 * HF_HIDDEN``, no dropout, default attention."""
    import transformers

    transformers.logging.set_verbosity_error()
    d, V = HF_HIDDEN, HF_VOCAB
    config: Any  # one of transformers' configuration classes
    if kind == "BERT":
        config = transformers.BertConfig(
            hidden_size=d, num_hidden_layers=2, num_attention_heads=4, intermediate_size=2 * d,
            max_position_embeddings=SEQ_LEN, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            vocab_size=V,
        )  # fmt: skip
        config.num_labels = NUM_CLASSES  # a PretrainedConfig keyword its stub does not declare
        return TokenLogits(transformers.BertForSequenceClassification(config))
    if kind == "DistilBERT":
        config = transformers.DistilBertConfig(
            dim=d, n_layers=2, n_heads=4, hidden_dim=2 * d, max_position_embeddings=SEQ_LEN, dropout=0.0,
            attention_dropout=0.0, seq_classif_dropout=0.0, vocab_size=V,
        )  # fmt: skip
        config.num_labels = NUM_CLASSES  # a PretrainedConfig keyword its stub does not declare
        return TokenLogits(transformers.DistilBertForSequenceClassification(config))
    if kind == "GPT2":
        config = transformers.GPT2Config(
            n_embd=d, n_layer=2, n_head=4, n_positions=SEQ_LEN, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            vocab_size=V, use_cache=False,
        )  # fmt: skip
        return TokenLogits(transformers.GPT2LMHeadModel(config))
    if kind == "T5":
        config = transformers.T5Config(
            d_model=d, d_kv=d // 4, d_ff=2 * d, num_layers=2, num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
            pad_token_id=0, vocab_size=V, use_cache=False,
        )  # fmt: skip
        config.decoder_start_token_id = 0  # a PretrainedConfig keyword its stub does not declare
        return TokenLogits(transformers.T5ForConditionalGeneration(config), seq2seq=True)
    config = transformers.LlamaConfig(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN, vocab_size=V, use_cache=False,
    )  # fmt: skip
    return TokenLogits(transformers.LlamaForCausalLM(config))


def _hf_tokens(targets: str) -> Callable[[int, torch.Generator], tuple[Tensor, Tensor]]:
    def data(rows: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        tokens = torch.randint(0, HF_VOCAB, (rows, SEQ_LEN), generator=gen)
        if targets == "class":
            return tokens, torch.randint(0, NUM_CLASSES, (rows,), generator=gen)
        return tokens, torch.randint(0, HF_VOCAB, (rows, SEQ_LEN), generator=gen)  # next tokens, every position

    return data


#: The zoo's Hugging Face transformers (:mod:`dpnotebook.benchmarks.zoo`) at CPU-realistic shapes: T = 64,
#: hidden 128, two layers, vocabulary 1000 (the zoo's builders are test-sized: T = 6, hidden 16). Every
#: flavour is the same model. ``python -m dpnotebook.benchmarks --transformers`` runs them with ghost and hooks.
TRANSFORMER_MODELS: dict[str, BenchModel] = {
    "BERT": BenchModel(lambda f: _hf("BERT"), _hf_tokens("class")),
    "DistilBERT": BenchModel(lambda f: _hf("DistilBERT"), _hf_tokens("class")),
    "GPT2": BenchModel(lambda f: _hf("GPT2"), _hf_tokens("tokens")),
    "T5": BenchModel(lambda f: _hf("T5"), _hf_tokens("tokens")),
    "Llama": BenchModel(lambda f: _hf("Llama"), _hf_tokens("tokens")),
}


def build(name: str, batch: int, *, K: int = 1, flavour: str = "dp", seed: int = 0) -> tuple[nn.Module, Tensor, Tensor]:
    """``(model, inputs, targets)`` for ``batch * K`` rows of the benchmark model ``name``.

    Args:
        name: a key of :data:`MODELS` or :data:`TRANSFORMER_MODELS`.
        batch: samples B.
        K: rows per sample (augmentation multiplicity); the batch holds ``B*K`` rows.
        flavour: ``"dp"``, ``"native"`` or ``"opacus"`` (see :class:`BenchModel`).
        seed: seeds the weights and the data.
    """
    known = {**MODELS, **TRANSFORMER_MODELS}
    if name not in known:
        raise ValueError(f"model={name!r} is unknown; choose one of {sorted(known)}.")
    torch.manual_seed(seed)
    model = known[name].make(flavour)
    x, y = known[name].data(batch * K, torch.Generator().manual_seed(seed))
    return model, x, y


__all__ = [
    "SampleConvNet",
    "MLP",
    "TextTransformer",
    "LSTMClassifier",
    "SmallResNetGN",
    "MODELS",
    "TRANSFORMER_MODELS",
    "TokenLogits",
    "build",
    "BenchModel",
]
