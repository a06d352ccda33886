"""The model zoo: tiny configurations of real architectures, each with its batch and its loss.

Five Hugging Face models (:func:`dpnotebook.models.tiny_transformer`) and three replicas of torchvision's
(``resnet``, ``vit``, ``convnext``); ``docs/real-models.md`` describes each. A test or a benchmark runs any:

>>> model, batch, loss = build("convnext")
>>> inputs, targets = batch(3)
>>> loss(model(*inputs), targets).shape
torch.Size([])

:func:`check_zoo_model` fixes a zoo model for a mode, validates it, runs one batch through the mode's
wrapper and returns its relative error against the float64 oracle:

>>> result = check_zoo_model("resnet", "hooks", rows=2)
>>> result.max_rel_err < 1e-10, result.fallback, result.whole_model
(True, [], False)
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import dpnotebook
from dpnotebook.compare import error_against
from dpnotebook.fine_tuning import token_cross_entropy
from dpnotebook.grad_sample import materialise, register_grad_sampler, register_norm_sampler
from dpnotebook.grad_sample.samplers.norms import channels_first_layer_norm_grad_sampler
from dpnotebook.models import TRANSFORMERS, tiny_transformer
from dpnotebook.modes import Unwrappable
from dpnotebook.privacy import clip_and_sum, clip_factors
from dpnotebook.testing import clean_copy, dot_loss, random_target, reference_grad_samples

#: Token vocabulary, sequence length, classes and image side of every zoo batch.
VOCAB, SEQ_LEN, NUM_CLASSES, IMAGE = 32, 6, 3, 12

Batch = Callable[..., tuple[tuple[Tensor, ...], Tensor]]
Loss = Callable[[Tensor, Tensor], Tensor]


class ZooCase(NamedTuple):
    """A zoo model (its output is one tensor), ``batch(rows, seed=0) -> (inputs, targets)`` and its mean loss."""

    model: nn.Module
    batch: Batch
    loss: Loss


def token_batch(targets: str, *, vocab: int = VOCAB, length: int = SEQ_LEN, classes: int = NUM_CLASSES) -> Batch:
    """Random token ids ``[rows, length]`` with a class per row (``"class"``), a token per position
    (``"tokens"``), or a token per position and the decoder's inputs, shifted right (``"seq2seq"``)."""

    def batch(rows: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (rows, length), generator=gen)
        if targets == "class":
            return (ids,), torch.randint(0, classes, (rows,), generator=gen)
        labels = torch.randint(0, vocab, (rows, length), generator=gen)
        if targets == "tokens":
            return (ids,), labels
        return (ids, torch.cat([labels.new_zeros(rows, 1), labels[:, :-1]], dim=1)), labels

    return batch


def image_batch(*shape: int, classes: int = NUM_CLASSES) -> Batch:
    """Random images of ``shape`` with a class each."""

    def batch(rows: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(rows, *shape, generator=gen),), torch.randint(0, classes, (rows,), generator=gen)

    return batch


def hf_case(
    kind: str,
    *,
    vocab: int = VOCAB,
    length: int = SEQ_LEN,
    positions: int = 16,
    width: int = 16,
    layers: int = 1,
    heads: int = 2,
    classes: int = NUM_CLASSES,
) -> tuple[Callable[[], nn.Module], Batch, Loss]:
    """``(make the model, make a batch, loss)`` of the Hugging Face architecture ``kind`` (weights from torch's
    global generator); the defaults are the zoo's size."""
    targets = {"bert": "class", "distilbert": "class", "t5": "seq2seq"}.get(kind, "tokens")
    size = {"length": positions, "width": width, "layers": layers, "heads": heads}
    make = partial(tiny_transformer, kind, vocab, **size, num_labels=classes, seed=None)
    loss = F.cross_entropy if targets == "class" else token_cross_entropy
    return make, token_batch(targets, vocab=vocab, length=length, classes=classes), loss


class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock``: conv-BN-ReLU-conv-BN, ``out += identity``, one shared in-place ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with one ``BasicBlock`` per stage.

    >>> ResNet()(torch.zeros(2, 3, 12, 12)).shape
    torch.Size([2, 3])
    """

    def __init__(self, widths: tuple[int, int, int, int] = (4, 4, 8, 8), num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, c = [], widths[0]
        for w, s in zip(widths, (1, 2, 2, 2), strict=True):
            stages.append(nn.Sequential(BasicBlock(c, w, s)))
            c = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MLPBlock(nn.Sequential):
    """torchvision's ViT ``MLPBlock``: Linear, GELU, Dropout, Linear, Dropout."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim), nn.Dropout(0.0))


class EncoderBlock(nn.Module):
    """torchvision's ViT ``EncoderBlock``: pre-norm ``nn.MultiheadAttention`` and MLP, both residual."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, mlp_dim)

    def forward(self, input: Tensor) -> Tensor:
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """torchvision's ViT ``Encoder``: it holds the position embedding ``[1, S, D]`` and the blocks."""

    def __init__(self, seq_length: int, layers: int, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            OrderedDict((f"encoder_layer_{i}", EncoderBlock(dim, heads, mlp_dim)) for i in range(layers))
        )
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, input: Tensor) -> Tensor:
        return self.ln(self.layers(self.dropout(input + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """torchvision's ``VisionTransformer``: patch convolution, class token on the root module, encoder, head.

    >>> VisionTransformer()(torch.zeros(2, 3, 12, 12)).shape
    torch.Size([2, 3])
    """

    def __init__(
        self,
        image_size: int = IMAGE,
        patch_size: int = 4,
        layers: int = 2,
        dim: int = 16,
        heads: int = 2,
        mlp_dim: int = 32,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        self.patch_size, self.hidden_dim = patch_size, dim
        self.conv_proj = nn.Conv2d(3, dim, patch_size, patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        seq_length = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(seq_length, layers, dim, heads, mlp_dim)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(dim, num_classes)))

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


class LayerNorm2d(nn.LayerNorm):
    """torchvision's ``LayerNorm2d``: a LayerNorm over channels of ``[N, C, H, W]`` (permuted to channels-last)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


# what a user does for their own channels-first LayerNorm (docs/real-models.md)
register_grad_sampler(LayerNorm2d)(channels_first_layer_norm_grad_sampler)
register_norm_sampler(LayerNorm2d, materialises=True)(materialise)


class Permute(nn.Module):
    """torchvision's ``Permute``."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: Tensor) -> Tensor:
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    """torchvision's ``CNBlock``: depthwise 7x7, channels-last LayerNorm and MLP, ``[C, 1, 1]`` layer scale."""

    def __init__(self, dim: int, layer_scale: float) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim),
            Permute([0, 2, 3, 1]),
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim),
            nn.GELU(),
            nn.Linear(4 * dim, dim),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.stochastic_depth = nn.Identity()  # drop probability 0

    def forward(self, input: Tensor) -> Tensor:
        result = self.stochastic_depth(self.layer_scale * self.block(input))
        result += input
        return result


class ConvNeXt(nn.Module):
    """torchvision's ``ConvNeXt``: 4x4 stem, stages of ``CNBlock`` with downsampling between, head
    (``layer_scale`` 0.5, not 1e-6, so that the blocks' gradients count in the comparisons).

    >>> ConvNeXt()(torch.zeros(2, 3, 12, 12)).shape
    torch.Size([2, 3])
    """

    def __init__(
        self, dims: tuple[int, ...] = (8, 16), layer_scale: float = 0.5, num_classes: int = NUM_CLASSES
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))]
        for i, d in enumerate(dims):
            stages.append(nn.Sequential(CNBlock(d, layer_scale)))
            if i + 1 < len(dims):
                stages.append(nn.Sequential(LayerNorm2d(d, eps=1e-6), nn.Conv2d(d, dims[i + 1], 2, 2)))
        self.features = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            LayerNorm2d(dims[-1], eps=1e-6), nn.Flatten(1), nn.Linear(dims[-1], num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)))


_images = image_batch(3, IMAGE, IMAGE)
#: ``name -> (make the model, make a batch, loss)``.
ZOO: dict[str, tuple[Callable[[], nn.Module], Batch, Loss]] = {
    **{kind: hf_case(kind) for kind in TRANSFORMERS},
    "resnet": (ResNet, _images, F.cross_entropy),
    "vit": (VisionTransformer, _images, F.cross_entropy),
    "convnext": (ConvNeXt, _images, F.cross_entropy),
}
#: The zoo models that come from Hugging Face ``transformers``.
HF_MODELS = tuple(TRANSFORMERS)


def build(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> ZooCase:
    """The zoo model ``name`` (weights seeded by ``seed``, parameters in ``dtype``), its batch maker and its loss.

    Raises:
        ValueError: ``name`` is not in the zoo (the message lists the zoo).

    >>> build("resnet").model.layer1[0].bn1
    BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True...)
    """
    if name not in ZOO:
        raise ValueError(f"model={name!r} is not in the zoo; choose one of {sorted(ZOO)}.")
    make, batch, loss = ZOO[name]
    torch.manual_seed(seed)
    return ZooCase(make().to(dtype), batch, loss)


@dataclass
class ZooCheck:
    """What :func:`check_zoo_model` found: the largest ``|got - oracle|`` over the largest ``|oracle|`` (``inf``
    where a per-sample gradient is missing or misshapen), the wrapper's ``(path, how)`` units, the paths of
    the ``torch.func`` ones, and whether one of them is the whole model."""

    max_rel_err: float
    units: list[tuple[str, str]] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)
    whole_model: bool = False


def prepared(name: str, mode: str, *, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Module:
    """The zoo model ``name`` after ``dpnotebook.fix`` for ``mode``, checked clean by ``dpnotebook.validate``.

    Raises:
        AssertionError: ``validate`` still reports problems after ``fix``.
    """
    fixed = dpnotebook.fix(build(name, seed=seed, dtype=dtype).model, mode=mode)
    problems = dpnotebook.validate(fixed, mode=mode)
    assert not problems, f"{name} after fix, mode {mode!r}: {problems}"
    return fixed


def cast_inputs(inputs: tuple[Tensor, ...], dtype: torch.dtype) -> tuple[Tensor, ...]:
    """The floating-point inputs in ``dtype`` (token ids stay)."""
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def oracle(
    model: nn.Module, name: str, rows: int, *, K: int = 1, seed: int = 1
) -> tuple[tuple[Tensor, ...], Tensor, dict[str, Tensor]]:
    """A float64 batch of zoo model ``name``, a random target and the oracle's per-sample gradients of ``model``."""
    inputs = cast_inputs(build(name).batch(rows * K, seed=seed)[0], torch.float64)
    target = random_target(model, inputs)
    return inputs, target, reference_grad_samples(model, inputs, target=target, K=K)


def check_zoo_model(
    name: str, mode: str, *, K: int = 1, rows: int = 3, dtype: torch.dtype = torch.float64, seed: int = 0
) -> ZooCheck:
    """Fix, validate, wrap and run zoo model ``name`` in ``mode`` on ``rows`` samples of ``K`` rows.

    The error is per sample and per parameter for the modes that fill ``p.grad_sample``; for ghost mode,
    by the per-sample norms and the clipped sums (bound at the oracle's median norm).

    Args:
        K, rows: rows per sample, and samples B.
        dtype, seed: the dtype the mode runs in (the oracle's is float64); the seed of weights and batch.

    Raises:
        GradSampleError, UnsupportedModuleError: the mode refuses the model (the message says why).
    """
    model = prepared(name, mode, dtype=torch.float64, seed=seed)
    inputs, target, ref = oracle(model, name, rows, K=K, seed=seed + 1)
    copy_ = clean_copy(model).to(dtype)
    wrapped = dpnotebook.wrap_model(copy_, mode, K=K, loss_reduction="sum")
    try:
        dot_loss(wrapped(*cast_inputs(inputs, dtype)), target.to(dtype)).backward()
        named = [(n, p) for n, p in copy_.named_parameters() if p.requires_grad]
        if hasattr(wrapped, "weighted_sums"):
            err = _clipped_sum_error(wrapped, named, ref)
        else:
            err = error_against({n: getattr(p, "grad_sample", None) for n, p in named}, ref)
        units = list(getattr(wrapped, "units", []))
    finally:
        cast(Unwrappable, wrapped).to_standard_module()  # every mode's wrapper has it
    return _result(err, units)


def _result(err: float, units: list[tuple[str, str]]) -> ZooCheck:
    fallback = [p for p, how in units if how == "torch.func"]
    return ZooCheck(err, units, fallback, "model" in fallback)


def units_after_a_step(name: str, mode: str, *, rows: int = 2) -> ZooCheck:
    """The units of zoo model ``name`` in ``mode`` after one forward and backward pass (``max_rel_err`` is NaN).

    >>> units_after_a_step("vit", "functorch").units
    [('model', 'torch.func')]
    """
    model = prepared(name, mode, dtype=torch.float32)
    case = build(name)
    inputs, targets = case.batch(rows)
    wrapped = dpnotebook.wrap_model(model, mode)
    try:
        case.loss(wrapped(*inputs), targets).backward()
        units = list(getattr(wrapped, "units", []))
    finally:
        cast(Unwrappable, wrapped).to_standard_module()
    return _result(math.nan, units)


def _clipped_sum_error(wrapped: Any, named: list[tuple[str, nn.Parameter]], ref: dict[str, Tensor]) -> float:
    C = float(clip_and_sum([ref[n] for n, _ in named], max_grad_norm=float("inf")).norms.median())
    want = clip_and_sum([ref[n] for n, _ in named], max_grad_norm=C)
    norms = wrapped.per_sample_norms().double()
    sums = wrapped.weighted_sums(clip_factors(norms, C))
    err = (norms - want.norms).abs().max().item()
    for (_, p), summed in zip(named, want.summed, strict=True):
        err = max(err, (sums.get(p, torch.zeros_like(p)).double() - summed).abs().max().item())
    return err / float(want.norms.max())


__all__ = [
    "ZOO",
    "HF_MODELS",
    "ZooCase",
    "build",
    "ResNet",
    "VisionTransformer",
    "ConvNeXt",
    "LayerNorm2d",
    "hf_case",
    "token_batch",
    "image_batch",
    "check_zoo_model",
    "units_after_a_step",
    "prepared",
    "oracle",
    "cast_inputs",
    "ZooCheck",
]
