"""Small models that train fast on a CPU and work with every grad-sample mode.

No batch normalisation (it mixes the samples of a batch); ``tanh`` activations, which tend to do
better than ReLU under DP-SGD (Papernot et al. 2021).

>>> import torch
>>> from dpnotebook.models import SmallCNN, MLP
>>> SmallCNN()(torch.zeros(5, 1, 8, 8)).shape
torch.Size([5, 10])
>>> MLP(in_features=64, hidden=32)(torch.zeros(5, 1, 8, 8)).shape
torch.Size([5, 10])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SmallCNN", "MLP", "SequenceClassifier", "Logits", "TRANSFORMERS", "tiny_transformer", "tiny_gpt2"]


class SmallCNN(nn.Module):
    """Two 3x3 convolutions (widths ``channels``) with ``tanh`` and 2x2 max pooling, then a linear classifier;
    ``image_size`` (the input's height and width) must be divisible by 4."""

    def __init__(
        self, *, in_channels: int = 1, num_classes: int = 10, channels: tuple[int, int] = (16, 32), image_size: int = 8
    ) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size={image_size} is invalid: the two poolings need a multiple of 4.")
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=3, padding=1),
            nn.Tanh(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),
            nn.Tanh(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(c2 * (image_size // 4) ** 2, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(start_dim=1))


class MLP(nn.Module):
    """Flatten, one hidden ``tanh`` layer of width ``hidden``, linear output (``in_features`` 64 for 8x8 digits)."""

    def __init__(self, *, in_features: int = 64, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SequenceClassifier(nn.Module):
    """Embedding, then an LSTM or a one-layer transformer encoder, then a linear classifier.

    ``kind`` is ``"lstm"`` (reads the last hidden state) or ``"transformer"`` (learned positions up to
    ``max_length``, mean over positions). Built from ``torch.nn`` layers on purpose: ``dpnotebook.fix``
    turns the ``nn.LSTM`` / ``nn.MultiheadAttention`` inside into their DP versions.

    >>> import torch
    >>> SequenceClassifier("transformer", vocab=10, dim=8)(torch.zeros(3, 5, dtype=torch.long)).shape
    torch.Size([3, 2])
    """

    def __init__(
        self, kind: str = "lstm", *, vocab: int = 20, dim: int = 32, num_classes: int = 2, max_length: int = 64
    ) -> None:
        super().__init__()
        if kind not in ("lstm", "transformer"):
            raise ValueError(f"kind={kind!r} is invalid; use 'lstm' or 'transformer'.")
        self.kind = kind
        self.embed = nn.Embedding(vocab, dim)
        if kind == "lstm":
            self.encoder: nn.Module = nn.LSTM(dim, dim, batch_first=True)
        else:
            self.positions = nn.Embedding(max_length, dim)
            self.encoder = nn.TransformerEncoderLayer(
                dim, nhead=2, dim_feedforward=2 * dim, dropout=0.0, batch_first=True
            )
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens)
        if self.kind == "lstm":
            return self.head(self.encoder(h)[0][:, -1])
        # positions looked up per row, so that each sample's use of the table is its own
        steps = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return self.head(self.encoder(h + self.positions(steps)).mean(dim=1))


class Logits(nn.Module):
    """A Hugging Face model called as a user calls it, with named inputs; returns its ``.logits``.

    ``Logits(gpt2)(tokens)`` is ``gpt2(input_ids=tokens).logits``; ``keys`` names each positional input in
    order (T5: ``("input_ids", "decoder_input_ids")``).
    """

    def __init__(self, model: nn.Module, keys: tuple[str, ...] = ("input_ids",)) -> None:
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *inputs: Tensor) -> Tensor:
        logits: Tensor = self.model(**dict(zip(self.keys, inputs, strict=True))).logits
        return logits


#: The architectures :func:`tiny_transformer` builds, and their ``transformers`` model classes.
TRANSFORMERS = {
    "bert": "BertForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "gpt2": "GPT2LMHeadModel",
    "t5": "T5ForConditionalGeneration",
    "llama": "LlamaForCausalLM",
}


def tiny_transformer(
    kind: str,
    vocab_size: int,
    *,
    length: int,
    width: int = 32,
    layers: int = 2,
    heads: int = 2,
    num_labels: int = 2,
    seed: int | None = 0,
) -> Logits:
    """A small, freshly initialised Hugging Face model (nothing is downloaded), as :class:`Logits`.

    Dropout off (so every mode can replay the forward), feed-forward ``2 * width`` (GPT-2: its default ``4 * width``),
    ``length`` positions (T5: 8 relative buckets; Llama: ``heads // 2`` key/value heads, 1 for an odd ``heads``).

    Args:
        kind: a key of :data:`TRANSFORMERS`; ``"bert"`` and ``"distilbert"`` classify a sequence into
            ``num_labels``, the others predict a token per position (T5 takes ``decoder_input_ids`` too).
        vocab_size: words in the vocabulary.
        length: the longest sequence.
        width: the hidden width (a multiple of ``heads``).
        layers: transformer blocks (T5: in the encoder and in the decoder).
        heads: attention heads.
        num_labels: classes of the classifiers.
        seed: seeds the initialisation; ``None`` uses torch's global generator.

    Raises:
        ValueError: ``kind`` is unknown.
        ImportError: ``transformers`` is not installed.

    >>> model = tiny_transformer("llama", 10, length=6, width=8, layers=1)
    >>> model(torch.zeros(3, 6, dtype=torch.long)).shape
    torch.Size([3, 6, 10])
    """
    if kind not in TRANSFORMERS:
        raise ValueError(f"kind={kind!r} is unknown; use one of {sorted(TRANSFORMERS)}.")
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            f"tiny_transformer({kind!r}) needs the transformers package: pip install transformers (or dpnotebook[lab])."
        ) from error
    transformers.logging.set_verbosity_error()
    d = width
    tokens: dict[str, Any] = {"bos_token_id": 0, "eos_token_id": 0, "use_cache": False}
    configs: dict[str, Callable[[], Any]] = {
        "bert": lambda: transformers.BertConfig(
            hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * d,
            max_position_embeddings=length, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        ),
        "distilbert": lambda: transformers.DistilBertConfig(
            dim=d, n_layers=layers, n_heads=heads, hidden_dim=2 * d, max_position_embeddings=length,
            dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
        ),
        "gpt2": lambda: transformers.GPT2Config(
            n_embd=d, n_layer=layers, n_head=heads, n_positions=length, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **tokens,
        ),
        "t5": lambda: transformers.T5Config(
            d_model=d, d_kv=d // heads, d_ff=2 * d, num_layers=layers, num_decoder_layers=layers,
            num_heads=heads, relative_attention_num_buckets=8, relative_attention_max_distance=length,
            dropout_rate=0.0, pad_token_id=0, eos_token_id=1, use_cache=False,
        ),
        "llama": lambda: transformers.LlamaConfig(
            hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=heads // 2 if heads % 2 == 0 else 1, max_position_embeddings=length, **tokens,
        ),
    }  # fmt: skip
    config = configs[kind]()
    config.vocab_size, config.num_labels, config.decoder_start_token_id = vocab_size, num_labels, 0
    keys = ("input_ids", "decoder_input_ids") if kind == "t5" else ("input_ids",)
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        return Logits(getattr(transformers, TRANSFORMERS[kind])(config), keys)


def tiny_gpt2(
    vocab_size: int, *, length: int, width: int = 32, layers: int = 2, heads: int = 2, seed: int = 0
) -> Logits:
    """:func:`tiny_transformer` for GPT-2 (tutorial 11), whose projections are ``transformers`` ``Conv1D`` layers.

    >>> tiny_gpt2(10, length=6, width=8, layers=1)(torch.zeros(3, 6, dtype=torch.long)).shape
    torch.Size([3, 6, 10])
    """
    return tiny_transformer("gpt2", vocab_size, length=length, width=width, layers=layers, heads=heads, seed=seed)
