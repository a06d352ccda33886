"""``LoRALinear``: a linear layer with a frozen weight and a trainable low-rank update.

Low-rank adaptation (Hu et al., "LoRA", 2021) fine-tunes a pretrained weight
``W`` (``[out, in]``) by learning only a product ``B A`` of rank ``r``:

.. math:: y = x W^T + b + \\frac{\\alpha}{r}\\, (x A^T) B^T,

with ``A`` of shape ``[r, in]`` and ``B`` of shape ``[out, r]``. ``W`` and
``b`` stay frozen, so DP-SGD clips and noises ``r * (in + out)`` numbers
instead of ``in * out``: the noise norm ``sigma * C * sqrt(d)`` grows with the
number ``d`` of trained parameters, the clipped signal does not.

``B`` starts at zero, so a fresh adapter leaves the pretrained layer's output
unchanged. Its grad sampler is :mod:`dpnotebook.grad_sample.samplers.lora`.

>>> import torch
>>> from torch import nn
>>> base = nn.Linear(4, 3)
>>> layer = LoRALinear.from_linear(base, rank=2, alpha=4.0)
>>> x = torch.randn(5, 4)
>>> torch.equal(layer(x), base(x))                 # B = 0: the adapter adds nothing yet
True
>>> [n for n, p in layer.named_parameters() if p.requires_grad]
['lora_A', 'lora_B']
>>> layer.scale
2.0
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LoRALinear", "add_lora"]


class LoRALinear(nn.Module):
    """``y = x W^T + b + (alpha / r) (x A^T) B^T`` with ``W``, ``b`` frozen and ``A``, ``B`` trained.

    Args:
        in_features: the input width.
        out_features: the output width.
        rank: ``r`` (an int >= 1), the rank of the update ``B A``.
        alpha: the update is scaled by ``alpha / rank`` (default ``rank``: scale 1).
        bias: whether the frozen base layer has a bias.
        generator: seeds the initialisation of ``A`` (``B`` starts at zero).

    Attributes:
        weight: ``[out, in]``, frozen (``requires_grad=False``).
        bias: ``[out]`` or ``None``, frozen.
        lora_A: ``[r, in]``, trained; uniform in ``±1/sqrt(in)``.
        lora_B: ``[out, r]``, trained; zeros.
        scale: ``alpha / rank``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        rank: int,
        alpha: float | None = None,
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: it must be an int >= 1.")
        if alpha is not None and not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha={alpha!r} is invalid: it must be a finite number > 0 (or None for alpha = rank).")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.alpha = float(rank if alpha is None else alpha)
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator), requires_grad=False
        )
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        self.lora_A = nn.Parameter(torch.empty(rank, in_features).uniform_(-bound, bound, generator=generator))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on the low-rank update."""
        return self.alpha / self.rank

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, *, rank: int, alpha: float | None = None, generator: torch.Generator | None = None
    ) -> LoRALinear:
        """A ``LoRALinear`` whose frozen weight and bias are copies of ``linear``'s (its output is ``linear``'s).

        Raises:
            TypeError: ``linear`` is not an ``nn.Linear``.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear={type(linear).__name__} is invalid: from_linear takes an nn.Linear.")
        layer = cls(
            linear.in_features,
            linear.out_features,
            rank=rank,
            alpha=alpha,
            bias=linear.bias is not None,
            generator=generator,
        )
        layer.to(device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None and layer.bias is not None:  # layer has a bias exactly when linear has one
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, alpha={self.alpha:g}"
        )


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
