"""The networks the benchmarks measure (the shapes of the Opacus baseline), each with its batch and its loss:

>>> model, inputs, targets, loss = build("MLP", batch=2)
>>> model(*inputs).shape, targets.shape
(torch.Size([2, 10]), torch.Size([2]))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.benchmarks.zoo import hf_case, image_batch, token_batch
from dpnotebook.layers import DPLSTM, DPMultiheadAttention

VOCAB, SEQ_LEN, NUM_CLASSES = 10_000, 64, 10


class SampleConvNet(nn.Module):
    """The network of Opacus' MNIST example (``examples/mnist.py``): two convolutions, two linear layers.

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
        attention: the class of ``self_attn`` (``nn.MultiheadAttention`` for the native model).

    >>> TextTransformer()(torch.zeros(2, 64, dtype=torch.long)).shape
    torch.Size([2, 10])
    """

    def __init__(self, attention: Callable[..., nn.Module] = DPMultiheadAttention, d: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, d)
        self.encoder = nn.TransformerEncoderLayer(d, 4, dim_feedforward=256, dropout=0.0, batch_first=True)
        # typed nn.MultiheadAttention, but the layer only calls it and reads attributes DPMultiheadAttention has
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


Loss = Callable[[Tensor, Tensor], Tensor]
Data = Callable[..., tuple[tuple[Tensor, ...], Tensor]]


@dataclass(frozen=True)
class BenchModel:
    """A benchmark model: ``make(flavour)`` builds it with dpnotebook's layers (``"dp"``), torch.nn's
    (``"native"``) or Opacus' (``"opacus"``); ``data(rows, seed) -> (inputs, targets)``; ``loss``, a mean."""

    make: Callable[[str], nn.Module]
    data: Data
    loss: Loss = F.cross_entropy


def _flavoured(native: Callable[..., nn.Module], dp: Callable[..., nn.Module]) -> Callable[[str], Any]:
    """The layer class of a flavour (Opacus' class of ``dp``'s name imported only for ``"opacus"``)."""

    def pick(flavour: str) -> Any:
        if flavour == "opacus":
            return getattr(importlib.import_module("opacus.layers"), dp.__name__)
        return native if flavour == "native" else dp

    return pick


_attention, _lstm = _flavoured(nn.MultiheadAttention, DPMultiheadAttention), _flavoured(nn.LSTM, DPLSTM)
_tokens = token_batch("class", vocab=VOCAB, length=SEQ_LEN, classes=NUM_CLASSES)

MODELS: dict[str, BenchModel] = {
    "SampleConvNet": BenchModel(lambda f: SampleConvNet(), image_batch(1, 28, 28, classes=NUM_CLASSES)),
    "MLP": BenchModel(lambda f: MLP(), image_batch(784, classes=NUM_CLASSES)),
    "TextTransformer": BenchModel(lambda f: TextTransformer(_attention(f)), _tokens),
    "LSTMClassifier": BenchModel(lambda f: LSTMClassifier(_lstm(f)), _tokens),
    "SmallResNetGN": BenchModel(lambda f: SmallResNetGN(), image_batch(3, 32, 32, classes=NUM_CLASSES)),
}


def _hf(kind: str) -> BenchModel:
    make, data, loss = hf_case(
        kind, vocab=1000, length=SEQ_LEN, positions=SEQ_LEN, width=128, layers=2, heads=4, classes=NUM_CLASSES
    )
    return BenchModel(lambda flavour: make(), data, loss)  # every flavour is the same model


#: The zoo's Hugging Face architectures at CPU-realistic shapes (T = 64, hidden 128, two layers, four heads,
#: vocabulary 1000), which ``python -m dpnotebook.benchmarks --transformers`` runs.
TRANSFORMER_MODELS = {name: _hf(name.lower()) for name in ("BERT", "DistilBERT", "GPT2", "T5", "Llama")}


class Built(NamedTuple):
    """A benchmark model, its batch and its loss: ``loss(model(*inputs), targets)`` is a step's loss."""

    model: nn.Module
    inputs: tuple[Tensor, ...]
    targets: Tensor
    loss: Loss


def build(name: str, batch: int, *, K: int = 1, flavour: str = "dp", seed: int = 0) -> Built:
    """The benchmark model ``name`` and a batch of ``batch * K`` rows for it.

    Args:
        name: a key of :data:`MODELS` or :data:`TRANSFORMER_MODELS`.
        batch, K: samples B and rows per sample (augmentation multiplicity).
        flavour: ``"dp"``, ``"native"`` or ``"opacus"`` (see :class:`BenchModel`).
        seed: seeds the weights and the data.

    Raises:
        ValueError: ``name`` is unknown.
    """
    known = {**MODELS, **TRANSFORMER_MODELS}
    if name not in known:
        raise ValueError(f"model={name!r} is unknown; choose one of {sorted(known)}.")
    torch.manual_seed(seed)
    model = known[name].make(flavour)
    inputs, targets = known[name].data(batch * K, seed)
    return Built(model, inputs, targets, known[name].loss)


__all__ = [
    "SampleConvNet",
    "MLP",
    "TextTransformer",
    "LSTMClassifier",
    "SmallResNetGN",
    "MODELS",
    "TRANSFORMER_MODELS",
    "build",
    "Built",
    "BenchModel",
]
