"""Ready a pretrained classifier for (private) fine-tuning on new classes: what to train, what to freeze.

DP-SGD's noise has one coordinate per *trained* parameter while the clipped signal is at most ``C`` per
sample: training fewer parameters keeps more of the signal. :func:`prepare_fine_tuning` knows
``"scratch"`` (a fresh model, all trained), ``"all"`` (a new head, all trained), ``"last"`` (only a new
head trained) and ``"lora"`` (a new head, and :class:`~dpnotebook.layers.lora.LoRALinear` adapters on
the frozen body's linear layers; a GPT-2 ``Conv1D`` is first replaced by :func:`replace_conv1d`). The
head is the last ``nn.Linear``. :func:`token_cross_entropy` and :func:`perplexity` serve language models.

>>> import torch
>>> from dpnotebook.models import MLP
>>> pretrained = MLP(in_features=64, hidden=32, num_classes=5)
>>> {how: trained_parameters(prepare_fine_tuning(pretrained, how, num_classes=3, rank=2))
...  for how in FINE_TUNING}
{'scratch': 2179, 'all': 2179, 'last': 99, 'lora': 291}
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from dpnotebook.layers.lora import add_lora
from dpnotebook.privacy import unwrap_model

__all__ = [
    "FINE_TUNING",
    "prepare_fine_tuning",
    "trained_parameters",
    "replace_conv1d",
    "linear_from_conv1d",
    "token_cross_entropy",
    "perplexity",
]

#: The ways :func:`prepare_fine_tuning` knows.
FINE_TUNING = ("scratch", "all", "last", "lora")


def trained_parameters(model: nn.Module) -> int:
    """``d``: how many numbers DP-SGD clips and noises (the parameters with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _head_name(model: nn.Module) -> str:
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n]
    if not names:
        raise ValueError(f"model ({type(model).__name__}) has no nn.Linear submodule to use as its head.")
    return names[-1]


def _conv1d_type() -> type[nn.Module] | None:
    module = sys.modules.get("transformers.pytorch_utils")
    return getattr(module, "Conv1D", None)


def linear_from_conv1d(layer: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` that computes what a ``transformers`` ``Conv1D`` (``x @ weight + bias``) computes,
    holding a copy of its weight transposed and of its bias.

    Raises:
        TypeError: ``layer`` is not a ``transformers.pytorch_utils.Conv1D``.
    """
    conv1d = _conv1d_type()
    if conv1d is None or not isinstance(layer, conv1d):
        raise TypeError(
            f"layer={type(layer).__name__} is invalid: linear_from_conv1d takes a transformers.pytorch_utils.Conv1D."
        )
    weight = cast(Tensor, layer.weight)
    bias = cast("Tensor | None", layer.bias)
    linear = nn.Linear(
        weight.shape[0], weight.shape[1], bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    linear.weight = nn.Parameter(weight.detach().T.clone(), requires_grad=weight.requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
    return linear


def replace_conv1d(model: nn.Module) -> list[str]:
    """Replace, in place, every ``transformers`` ``Conv1D`` of ``model`` by :func:`linear_from_conv1d`'s ``nn.Linear``.

    Returns:
        The qualified names of the replaced layers (empty for a model without ``Conv1D``).

    >>> from dpnotebook.models import tiny_gpt2
    >>> model = tiny_gpt2(10, length=4, width=8, layers=1)
    >>> tokens = torch.tensor([[1, 2, 3, 4]])
    >>> before = model(tokens)
    >>> [name.rsplit(".", 2)[-2:] for name in replace_conv1d(model)]
    [['attn', 'c_attn'], ['attn', 'c_proj'], ['mlp', 'c_fc'], ['mlp', 'c_proj']]
    >>> model.model.transformer.h[0].mlp.c_fc, torch.allclose(model(tokens), before, atol=1e-6)
    (Linear(in_features=8, out_features=32, bias=True), True)
    """
    conv1d = _conv1d_type()
    if conv1d is None:
        return []
    names = [n for n, m in model.named_modules() if isinstance(m, conv1d) and n]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, linear_from_conv1d(getattr(parent, child)))
    return names


def prepare_fine_tuning(
    pretrained: nn.Module,
    how: str,
    *,
    num_classes: int | None,
    rank: int = 4,
    alpha: float | None = None,
    seed: int = 0,
) -> nn.Module:
    """A copy of ``pretrained`` (not changed) set up for fine-tuning ``how`` (see the module docstring).

    Args:
        pretrained: a model whose last ``nn.Linear`` is its head (after :func:`replace_conv1d` for ``"lora"``).
        how: one of :data:`FINE_TUNING`.
        num_classes: the new head's outputs; ``None`` keeps the pretrained head (trained under ``"last"``,
            ``"all"`` and ``"scratch"``, frozen under ``"lora"``).
        rank: the adapters' rank (``"lora"``).
        alpha: the adapters' scale numerator (default ``rank``).
        seed: seeds the new head (and the adapters, or the whole model for ``"scratch"``).

    Raises:
        ValueError: an unknown ``how``.
    """
    if how not in FINE_TUNING:
        raise ValueError(f"how={how!r} is invalid; use one of {FINE_TUNING}.")
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise ValueError(f"num_classes={num_classes!r} is invalid: use an int >= 1, or None to keep the head.")
    model = copy.deepcopy(pretrained)
    if how == "lora":
        replace_conv1d(model)
    head = _head_name(model)
    parent_name, _, child = head.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old: nn.Linear = getattr(parent, child)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if how == "scratch":
            for m in model.modules():
                reset: Callable[[], None] | None = getattr(m, "reset_parameters", None)
                if reset is not None:
                    reset()
        new_head = None if num_classes is None else nn.Linear(old.in_features, num_classes, bias=old.bias is not None)
    for p in model.parameters():
        p.requires_grad_(how in ("scratch", "all"))
    if how == "lora":
        body = [n for n, m in model.named_modules() if type(m) is nn.Linear and n and n != head]
        add_lora(model, rank=rank, alpha=alpha, seed=seed, names=body)
    if new_head is not None:
        new_head.to(device=old.weight.device, dtype=old.weight.dtype)
        setattr(parent, child, new_head)
    elif how == "last":
        old.requires_grad_(True)
    return model


def token_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """The mean next-token cross-entropy over a batch: ``logits [B, T, V]``, ``targets [B, T]``.

    Every row has ``T`` tokens, so it is a ``loss_reduction="mean"`` loss (the mean of the rows' losses).

    >>> logits = torch.zeros(2, 3, 5)                 # uniform over 5 words
    >>> round(token_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long)).item(), 4) == round(math.log(5), 4)
    True
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def perplexity(model: nn.Module, data_loader: DataLoader[Any]) -> float:
    """``exp`` of the mean next-token cross-entropy of ``model`` (unwrapped, in eval mode) on ``(tokens, targets)``:
    ``V`` for an even guess over ``V`` words, 1 for a perfect model."""
    plain = unwrap_model(model)
    was_training = plain.training
    plain.eval()
    device = next((p.device for p in plain.parameters()), torch.device("cpu"))
    total, count = 0.0, 0
    for tokens, targets in data_loader:
        tokens, targets = tokens.to(device), targets.to(device)
        total += F.cross_entropy(plain(tokens).flatten(0, 1), targets.flatten(), reduction="sum").item()
        count += targets.numel()
    plain.train(was_training)
    return math.exp(total / count) if count else float("nan")
