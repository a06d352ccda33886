"""The model zoo: tiny configurations of real architectures, each with its batch and its loss.

Five Hugging Face models built from small configurations (nothing is
downloaded; ``transformers`` is imported only by their builders) and three
replicas written with the same module structure as torchvision's (torchvision
itself is not a dependency):

==============  ==========================================================================
``bert``        ``BertForSequenceClassification`` (position table looked up once, ``[1, T]``)
``distilbert``  ``DistilBertForSequenceClassification``
``gpt2``        ``GPT2LMHeadModel`` (tied embeddings, ``Conv1D``)
``t5``          ``T5ForConditionalGeneration`` (relative attention bias; ``decoder_input_ids``)
``llama``       ``LlamaForCausalLM`` (RMSNorm, rotary embeddings)
``resnet``      torchvision's ResNet: BatchNorm (``fix`` makes it GroupNorm), ``out += identity``
``vit``         torchvision's ViT: class token on the root, position embedding on the encoder,
                ``nn.MultiheadAttention`` (``fix`` makes it ``DPMultiheadAttention``)
``convnext``    torchvision's ConvNeXt: channels-last ``LayerNorm2d`` (its samplers registered here, as a
                user would: ``docs/real-models.md``), ``[C, 1, 1]`` layer scale,
                depthwise 7x7 convolution
==============  ==========================================================================

:func:`build` returns a :class:`ZooCase`: the model (its output is a tensor:
the Hugging Face models are wrapped in :class:`Logits`, which returns
``.logits`` and changes nothing else), ``batch(rows, seed)`` returning
``(inputs, targets)``, and ``loss(output, targets)`` (the mean over rows), so
that a test or a benchmark runs any of them the same way:

>>> model, batch, loss = build("convnext")
>>> inputs, targets = batch(3)
>>> loss(model(*inputs), targets).shape
torch.Size([])

``python -m dpnotebook.benchmarks.zoo`` prints the zoo table (see
:mod:`dpnotebook.benchmarks.zoo.__main__`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample.engine.registry import register_grad_sampler
from dpnotebook.grad_sample.ghost.groups import materialise
from dpnotebook.grad_sample.ghost.registry import register_norm_sampler
from dpnotebook.grad_sample.samplers.norms import channels_first_layer_norm_grad_sampler

#: Token vocabulary, sequence length, classes and image side of every zoo batch.
VOCAB, SEQ_LEN, NUM_CLASSES, IMAGE = 32, 6, 3, 12

Batch = Callable[..., tuple[tuple[Tensor, ...], Tensor]]


class ZooCase(NamedTuple):
    """A zoo model, how to make its batch, and its loss.

    Attributes:
        model: the module (its output is one tensor).
        batch: ``batch(rows, seed=0) -> (inputs, targets)``; ``model(*inputs)`` runs it.
        loss: ``loss(model(*inputs), targets)``: cross-entropy, mean over rows (and tokens).
    """

    model: nn.Module
    batch: Batch
    loss: Callable[[Tensor, Tensor], Tensor]


# ---------------------------------------------------------------- Hugging Face models


class Logits(nn.Module):
    """Calls a Hugging Face model with its inputs named ``keys`` and returns ``.logits``.

    The wrapped model is unchanged; only its output is unwrapped, so that the
    oracle, the grad-sample modes and ``PrivacyEngine`` see a tensor.

    Args:
        hf: the Hugging Face model.
        keys: the keyword of each positional input, in order.
    """

    def __init__(self, hf: nn.Module, keys: tuple[str, ...] = ("input_ids",)) -> None:
        super().__init__()
        self.hf = hf
        self.keys = keys

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.hf(**dict(zip(self.keys, inputs, strict=True))).logits


def _classify(output: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(output, targets)


def _tokens_loss(output: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(output.flatten(0, 1), targets.flatten())


def _token_batch(targets: str) -> Batch:
    """Random token ids; targets a class per row (``"class"``) or a token per position (``"tokens"``)."""

    def batch(rows: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen)
        if targets == "class":
            return (ids,), torch.randint(0, NUM_CLASSES, (rows,), generator=gen)
        return (ids,), torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen)

    return batch


def _seq2seq_batch(rows: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen)
    labels = torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen)
    decoder_ids = torch.cat([torch.zeros(rows, 1, dtype=torch.long), labels[:, :-1]], dim=1)  # shifted right
    return (ids, decoder_ids), labels


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the lab and test extras install it
        raise ImportError(
            "the Hugging Face zoo models need transformers: pip install -e '.[lab]' (transformers>=4.40)."
        ) from e
    transformers.logging.set_verbosity_error()
    return transformers


def bert() -> nn.Module:
    """``BertForSequenceClassification``: hidden 16, one layer, two heads, three classes."""
    t = _transformers()
    config = t.BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=NUM_CLASSES,
    )
    return Logits(t.BertForSequenceClassification(config))


def distilbert() -> nn.Module:
    """``DistilBertForSequenceClassification``: dim 16, one layer, two heads, three classes."""
    t = _transformers()
    config = t.DistilBertConfig(
        vocab_size=VOCAB,
        dim=16,
        n_layers=1,
        n_heads=2,
        hidden_dim=32,
        max_position_embeddings=16,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
        num_labels=NUM_CLASSES,
    )
    return Logits(t.DistilBertForSequenceClassification(config))


def gpt2() -> nn.Module:
    """``GPT2LMHeadModel``: embedding 16 (tied with the LM head), one layer, two heads."""
    t = _transformers()
    config = t.GPT2Config(
        vocab_size=VOCAB,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return Logits(t.GPT2LMHeadModel(config))


def t5() -> nn.Module:
    """``T5ForConditionalGeneration``: d_model 16, one encoder and one decoder layer, 8 relative buckets."""
    t = _transformers()
    config = t.T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return Logits(t.T5ForConditionalGeneration(config), ("input_ids", "decoder_input_ids"))


def llama() -> nn.Module:
    """``LlamaForCausalLM``: hidden 16, one layer, two query heads sharing one key/value head."""
    t = _transformers()
    config = t.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return Logits(t.LlamaForCausalLM(config))


# ---------------------------------------------------------------- torchvision replicas


def _image_batch(rows: int, seed: int = 0) -> tuple[tuple[Tensor, ...], Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, IMAGE, IMAGE, generator=gen)
    return (x,), torch.randint(0, NUM_CLASSES, (rows,), generator=gen)


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
    """torchvision's ``ResNet`` with one ``BasicBlock`` per stage (``widths`` per stage).

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


# What a user does for their own channels-first LayerNorm (docs/real-models.md): our formula, registered for the class
# (its forward is overridden, so nn.LayerNorm's samplers do not apply). Ghost mode materialises it like nn.LayerNorm.
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
    """torchvision's ``ConvNeXt``: 4x4 stem, stages of ``CNBlock`` with downsampling between, head.

    ``layer_scale`` is 0.5 rather than torchvision's 1e-6, so that the blocks'
    gradients are not negligible in the comparisons.

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


# ---------------------------------------------------------------- the registry

#: ``name -> (make the model, make a batch, loss)``.
ZOO: dict[str, tuple[Callable[[], nn.Module], Batch, Callable[[Tensor, Tensor], Tensor]]] = {
    "bert": (bert, _token_batch("class"), _classify),
    "distilbert": (distilbert, _token_batch("class"), _classify),
    "gpt2": (gpt2, _token_batch("tokens"), _tokens_loss),
    "t5": (t5, _seq2seq_batch, _tokens_loss),
    "llama": (llama, _token_batch("tokens"), _tokens_loss),
    "resnet": (ResNet, _image_batch, _classify),
    "vit": (VisionTransformer, _image_batch, _classify),
    "convnext": (ConvNeXt, _image_batch, _classify),
}
#: The zoo models that come from Hugging Face ``transformers``.
HF_MODELS = ("bert", "distilbert", "gpt2", "t5", "llama")


def build(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> ZooCase:
    """The zoo model ``name`` (weights seeded by ``seed``, in ``dtype``), its batch maker and its loss.

    Args:
        name: a key of :data:`ZOO`.
        seed: seeds the weights (``batch`` takes its own seed).
        dtype: the parameters' dtype (``torch.float64`` for the oracle comparisons); ``batch``
            makes float32 images, cast them alike.

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


__all__ = [
    "ZOO",
    "HF_MODELS",
    "ZooCase",
    "build",
    "Logits",
    "ResNet",
    "VisionTransformer",
    "ConvNeXt",
    "LayerNorm2d",
]
