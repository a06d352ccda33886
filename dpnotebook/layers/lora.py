"""Low-rank adapters for private fine-tuning: :func:`add_lora` puts a :class:`~dpnotebook.units.LoRALinear` in place of
each chosen ``nn.Linear`` and freezes the rest, so DP-SGD noises only the adapters.
"""

from __future__ import annotations

import torch
from torch import nn

from dpnotebook.units import LoRALinear

__all__ = ["LoRALinear", "add_lora"]


def add_lora(
    model: nn.Module, *, rank: int, alpha: float | None = None, seed: int = 0, names: list[str] | None = None
) -> nn.Module:
    """Replace ``nn.Linear`` layers of ``model`` (in place) by :class:`LoRALinear` and freeze everything else.

    Args:
        model: the pretrained model.
        rank: the adapters' rank.
        alpha: their scale numerator (default ``rank``).
        seed: seeds the adapters' ``A`` matrices.
        names: the qualified names of the linear layers to adapt (default: all of them).

    Returns:
        ``model``, whose only trainable parameters are now the adapters' ``lora_A`` and ``lora_B``.

    >>> from torch import nn
    >>> model = add_lora(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), rank=1)
    >>> sum(p.numel() for p in model.parameters() if p.requires_grad)    # (4 + 8) + (8 + 2)
    22
    """
    if type(model) is nn.Linear:
        raise TypeError("model is a single nn.Linear: use LoRALinear.from_linear(model, rank=...) instead.")
    linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear}
    wanted = list(linears) if names is None else names
    unknown = [n for n in wanted if n not in linears]
    if unknown:
        raise ValueError(
            f"names={unknown!r} are not nn.Linear layers of the model; its linear layers are {list(linears)}."
        )
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name in wanted:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear.from_linear(linears[name], rank=rank, alpha=alpha, generator=generator))
    return model
