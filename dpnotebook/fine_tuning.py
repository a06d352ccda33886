"""Ready a pretrained classifier for (private) fine-tuning on new classes: what to train, what to freeze.

The recipe that makes DP-SGD work on real models is to pretrain on public data
and train privately on top. DP-SGD's noise has one coordinate per *trained*
parameter (its norm is about ``sigma * C * sqrt(d)``), while the clipped signal
is at most ``C`` per sample whatever ``d`` is: training fewer parameters keeps
more of the signal. :func:`prepare_fine_tuning` gives the usual choices:

* ``"scratch"``: a freshly initialised model of the same architecture, all trained;
* ``"all"``: the pretrained model with a new head, all layers trained;
* ``"last"``: the pretrained body frozen, only a new head trained;
* ``"lora"``: a new head, and low-rank adapters (:class:`~dpnotebook.layers.lora.LoRALinear`)
  on the body's linear layers, whose weights stay frozen.

The head is the model's last ``nn.Linear`` (in ``named_modules`` order).

>>> import torch
>>> from dpnotebook.models import MLP
>>> pretrained = MLP(in_features=64, hidden=32, num_classes=5)
>>> {how: trained_parameters(prepare_fine_tuning(pretrained, how, num_classes=3, rank=2))
...  for how in FINE_TUNING}
{'scratch': 2179, 'all': 2179, 'last': 99, 'lora': 291}
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from dpnotebook.layers.lora import add_lora

__all__ = ["FINE_TUNING", "prepare_fine_tuning", "trained_parameters"]

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


def prepare_fine_tuning(
    pretrained: nn.Module, how: str, *, num_classes: int, rank: int = 4, alpha: float | None = None, seed: int = 0
) -> nn.Module:
    """A copy of ``pretrained`` set up for fine-tuning ``how`` (see the module docstring); ``pretrained`` is not changed.

    Args:
        pretrained: a classifier whose last ``nn.Linear`` is its head.
        how: one of :data:`FINE_TUNING`.
        num_classes: the new head's outputs.
        rank: the adapters' rank (``"lora"``).
        alpha: the adapters' scale numerator (default ``rank``).
        seed: seeds the new head (and the adapters, or the whole model for ``"scratch"``).

    Raises:
        ValueError: an unknown ``how``.
    """
    if how not in FINE_TUNING:
        raise ValueError(f"how={how!r} is invalid; use one of {FINE_TUNING}.")
    model = copy.deepcopy(pretrained)
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
        new_head = nn.Linear(old.in_features, num_classes, bias=old.bias is not None)
    new_head.to(device=old.weight.device, dtype=old.weight.dtype)
    for p in model.parameters():
        p.requires_grad_(how in ("scratch", "all"))
    if how == "lora":
        body = [n for n, m in model.named_modules() if type(m) is nn.Linear and n and n != head]
        add_lora(model, rank=rank, alpha=alpha, seed=seed, names=body)
    setattr(parent, child, new_head)
    return model
