"""Small models that train fast on a CPU and work with every grad-sample mode.

No batch normalisation (it mixes the samples of a batch); ``tanh``
activations, which tend to do better than ReLU under DP-SGD (Papernot et al.,
"Tempered Sigmoid Activations for Deep Learning with Differential Privacy", 2021).

>>> import torch
>>> from dpnotebook.models import SmallCNN, MLP
>>> SmallCNN()(torch.zeros(5, 1, 8, 8)).shape
torch.Size([5, 10])
>>> MLP(in_features=64, hidden=32)(torch.zeros(5, 1, 8, 8)).shape
torch.Size([5, 10])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SmallCNN", "MLP", "SequenceClassifier", "LanguageModelLogits", "tiny_gpt2"]


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with ``tanh`` and 2x2 max pooling, then a linear classifier.

    For ``image_size`` 8 (digits) the feature map is ``channels[1] x 2 x 2``.

    Args:
        in_channels: image channels (1 for grey).
        num_classes: outputs.
        channels: the two convolutions' widths.
        image_size: the input's height and width (divisible by 4).
    """

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
    """Flatten, one hidden ``tanh`` layer, linear output.

    Args:
        in_features: the number of input values per sample (64 for 8x8 digits).
        hidden: the hidden width.
        num_classes: outputs.
    """

    def __init__(self, *, in_features: int = 64, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SequenceClassifier(nn.Module):
    """Embedding, then an LSTM or a one-layer transformer encoder, then a linear classifier.

    Built from ``torch.nn`` layers on purpose: ``dpnotebook.fix(model)`` turns the
    ``nn.LSTM`` / ``nn.MultiheadAttention`` inside into their DP versions.

    Args:
        kind: ``"lstm"`` (reads the last hidden state) or ``"transformer"``
            (learned positions, mean over positions).
        vocab: vocabulary size.
        dim: embedding and hidden width.
        num_classes: outputs.
        max_length: longest sequence (for the transformer's positions).

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
        # positions looked up per row (not once for all rows), so each sample's use of the
        # position table is its own and per-sample gradients can see it
        steps = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return self.head(self.encoder(h + self.positions(steps)).mean(dim=1))


class LanguageModelLogits(nn.Module):
    """``tokens [B, T] -> logits [B, T, vocab]`` for a Hugging Face causal language model (e.g. ``GPT2LMHeadModel``).

    The model is called as a user would call it, ``model(input_ids=tokens)``: its position table,
    looked up once with ``[1, T]`` ids and broadcast over the batch, gets per-sample gradients in
    every mode (hooks and ghost mode follow it to where it meets the batch,
    :mod:`dpnotebook.grad_sample._engine.broadcast`).

    Args:
        model: called as ``model(input_ids=tokens)``; its output has ``.logits``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor) -> Tensor:
        logits: Tensor = self.model(input_ids=tokens).logits
        return logits


def tiny_gpt2(
    vocab_size: int, *, length: int, width: int = 32, layers: int = 2, heads: int = 2, seed: int = 0
) -> LanguageModelLogits:
    """A small, freshly initialised Hugging Face ``GPT2LMHeadModel`` (no download), as :class:`LanguageModelLogits`.

    GPT-2's structure at toy size: token and position tables, pre-norm blocks whose attention and
    MLP projections are ``transformers`` ``Conv1D`` layers, and an output layer tied to the token
    table. Dropout is off, so every grad-sample mode (functorch included) can replay the forward.

    Args:
        vocab_size: words in the vocabulary.
        length: the longest sequence (the position table's size).
        width: the embedding width (a multiple of ``heads``).
        layers: transformer blocks.
        heads: attention heads.
        seed: seeds the initialisation.

    Raises:
        ImportError: ``transformers`` is not installed.

    >>> model = tiny_gpt2(10, length=6, width=8, layers=1)
    >>> model(torch.zeros(3, 6, dtype=torch.long)).shape
    torch.Size([3, 6, 10])
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as error:
        raise ImportError(
            "tiny_gpt2 needs the transformers package: pip install transformers (or dpnotebook[lab])."
        ) from error
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=length,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LanguageModelLogits(GPT2LMHeadModel(config))
