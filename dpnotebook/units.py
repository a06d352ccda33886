"""The units that grad samplers compute formulas for, below both the samplers and the DP layers.

A DP layer keeps its parameters under their ``torch.nn`` names (the native ``state_dict``) and also
registers each on a :class:`SharedParameters` unit, whose grad sampler hooks mode runs.
``named_parameters()`` lists each object once, under its native name, and a unit saves nothing.

>>> import torch
>>> from torch import nn
>>> parent = nn.Module()
>>> parent.weight = nn.Parameter(torch.ones(2))
>>> parent.view = SharedParameters(w=parent.weight)
>>> [n for n, _ in parent.named_parameters()], list(parent.state_dict())
(['weight'], ['weight'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError

__all__ = [
    "SharedParameters",
    "UnitOwner",
    "InProjection",
    "AppendBias",
    "OutProjection",
    "HiddenRecord",
    "GateProjection",
    "LoRALinear",
]


class SharedParameters(nn.Module):
    """A module whose parameters belong to its parent; ``slots`` maps a slot name to a parameter (or ``None``)."""

    def __init__(self, **slots: nn.Parameter | None) -> None:
        super().__init__()
        self.slot_names = tuple(slots)
        self.share(**slots)

    def share(self, **slots: nn.Parameter | None) -> None:
        """Point the slots at (new) parameter objects of the parent."""
        self._parameters.update(slots)

    def extra_repr(self) -> str:
        return f"shares={list(self.slot_names)}"

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """Save nothing: the parent saves these parameters under their native names."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load nothing: the parent loads these parameters (the same objects)."""


class UnitOwner(nn.Module):
    """A layer whose units share its parameters; it re-points them whenever one is replaced.

    That happens in ``load_state_dict(assign=True)``, ``layer.weight = nn.Parameter(...)`` and ``.to()``
    under ``torch.__future__.set_overwrite_module_params_on_conversion``. The layer sets ``_unit_links``,
    ``(unit, {slot: parameter name})`` for each unit, once its units exist.
    """

    _dpn_grad_samples_from_children = True  # hooks mode reads the units' samplers, not the layer's
    _unit_links: list[tuple[SharedParameters, dict[str, str]]] = []

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if any(name in names.values() for _, names in self._unit_links):
            self._reshare()

    def _apply(self, fn: Any, recurse: bool = True) -> UnitOwner:
        out = super()._apply(fn, recurse)
        self._reshare()
        return out

    def _reshare(self) -> None:
        """Point each unit's slots at this layer's current parameters."""
        for unit, names in self._unit_links:
            unit.share(**{slot: getattr(self, name) for slot, name in names.items()})


class InProjection(SharedParameters):
    """``x @ weight[w0:w1].T + bias[b0:b1]``: attention's packed q/k/v projection, batch-first.

    >>> w, b = nn.Parameter(torch.ones(6, 2)), nn.Parameter(torch.arange(6.0))
    >>> InProjection(w, b)(torch.ones(1, 1, 2), (2, 4), (2, 4))
    tensor([[[4., 5.]]], grad_fn=<ViewBackward0>)
    """

    _dpn_batch_first = True
    weight: nn.Parameter  # the slots (declared for the type checker)
    bias: nn.Parameter | None

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__(weight=weight, bias=bias)

    def forward(self, x: Tensor, weight_rows: tuple[int, int], bias_rows: tuple[int, int]) -> Tensor:
        """Project ``x`` ``[N, L, in]`` with the given rows of the weight and the bias."""
        bias = None if self.bias is None else self.bias[bias_rows[0] : bias_rows[1]]
        return F.linear(x, self.weight[weight_rows[0] : weight_rows[1]], bias)


class AppendBias(SharedParameters):
    """Append the parent's ``bias_k``/``bias_v`` (``[1, 1, E]``) to every sequence: ``[N, S, E] -> [N, S+1, E]``.

    >>> AppendBias(nn.Parameter(torch.ones(1, 1, 2)))(torch.zeros(3, 4, 2)).shape
    torch.Size([3, 5, 2])
    """

    _dpn_batch_first = True
    bias: nn.Parameter

    def __init__(self, bias: nn.Parameter) -> None:
        super().__init__(bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.bias.expand(x.shape[0], 1, x.shape[2])], 1)


class OutProjection(nn.modules.linear.NonDynamicallyQuantizableLinear):
    """Attention's output ``nn.Linear`` (whose grad sampler it inherits), always called batch-first."""

    _dpn_batch_first = True


@dataclass
class HiddenRecord:
    """The hidden states one direction of one recurrent layer went through (filled by the layer).

    Attributes:
        reverse: the direction ran from the last time step to the first.
        h0: initial hidden state, ``[B, H]``.
        states: hidden state after each time step, ``[B, T, H]``, in time order.
    """

    reverse: bool
    h0: Tensor | None = None
    states: Tensor | None = None

    def hidden_inputs(self) -> Tensor:
        """``h_{t-1}``: the hidden state that entered the step at each time ``t``, ``[B, T, H]``.

        >>> rec = HiddenRecord(False, h0=torch.zeros(1, 1), states=torch.tensor([[[1.], [2.]]]))
        >>> rec.hidden_inputs().flatten().tolist()
        [0.0, 1.0]
        >>> HiddenRecord(True, rec.h0, rec.states).hidden_inputs().flatten().tolist()
        [2.0, 0.0]
        """
        if self.h0 is None or self.states is None:
            raise GradSampleError(
                "a GateProjection was called outside its recurrent layer, so the hidden states "
                "its per-sample gradients need were never recorded. Call the DP layer itself."
            )
        first = self.h0.unsqueeze(1)
        return torch.cat([self.states[:, 1:], first] if self.reverse else [first, self.states[:, :-1]], 1)


class GateProjection(SharedParameters):
    """``x_t W_ih^T + b_ih (+ b_hh)`` for all time steps of one recurrent layer and direction.

    The gradient of its output is ``g_t = dL/dgates_t`` at every step, so its sampler gives all four
    parameters' per-sample gradients (``sum_t g_t^T x_t``, ``sum_t g_t^T h_{t-1}``, ``sum_t g_t``), with
    the ``h_{t-1}`` the layer writes into the :class:`HiddenRecord`.

    Args:
        mode: ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``.
        weight_ih, weight_hh, bias_ih, bias_hh: the parent's parameters (biases may be ``None``).
    """

    _dpn_batch_first = True  # inputs [B, T, I] and outputs [B, T, G], whatever the wrapper says
    weight_ih: nn.Parameter
    weight_hh: nn.Parameter
    bias_ih: nn.Parameter | None
    bias_hh: nn.Parameter | None

    def __init__(
        self,
        mode: str,
        weight_ih: nn.Parameter,
        weight_hh: nn.Parameter,
        bias_ih: nn.Parameter | None = None,
        bias_hh: nn.Parameter | None = None,
    ) -> None:
        super().__init__(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh)
        self.mode = mode

    def input_bias(self) -> Tensor | None:
        """The bias added before the loop: ``b_ih + b_hh``, or ``b_ih`` alone for GRU."""
        if self.bias_ih is None or self.bias_hh is None or self.mode == "GRU":
            return self.bias_ih
        return self.bias_ih + self.bias_hh

    def forward(self, x: Tensor, record: HiddenRecord) -> Tensor:
        """``[B, T, I] -> [B, T, G]`` in one product; batch-major, so a sample's gradient rows sit together."""
        return F.linear(x, self.weight_ih, self.input_bias())

    def hidden_backprops(self, x: Tensor, h_prev: Tensor, g: Tensor) -> Tensor:
        """``dL/d(h_{t-1} W_hh^T + b_hh)`` from ``g = dL/dgates`` (they differ only for GRU)."""
        if self.mode != "GRU":
            return g
        H = h_prev.shape[-1]
        b_ih, b_hh = self.bias_ih, self.bias_hh
        pre_r = F.linear(x, self.weight_ih[:H], None if b_ih is None else b_ih[:H])
        pre_r = pre_r + F.linear(h_prev, self.weight_hh[:H], None if b_hh is None else b_hh[:H])
        return torch.cat([g[..., : 2 * H], torch.sigmoid(pre_r) * g[..., 2 * H :]], -1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, shares={list(self.slot_names)}"


class LoRALinear(nn.Module):
    """``y = x W^T + b + (alpha / r) (x A^T) B^T`` with ``W``, ``b`` frozen and ``A``, ``B`` trained.

    Low-rank adaptation (Hu et al., 2021): DP-SGD noises ``r * (in + out)`` numbers, not ``in * out``.
    ``B`` starts at zero, so a fresh adapter leaves the layer's output unchanged.

    Args:
        in_features: the input width.
        out_features: the output width.
        rank: ``r`` (an int >= 1), the rank of the update ``B A``.
        alpha: the update is scaled by ``alpha / rank`` (default ``rank``: scale 1).
        bias: whether the frozen base layer has a bias.
        generator: seeds the initialisation of ``A`` (uniform in ``±1/sqrt(in)``).

    >>> base = nn.Linear(4, 3)
    >>> layer = LoRALinear.from_linear(base, rank=2, alpha=4.0)
    >>> x = torch.randn(5, 4)
    >>> torch.equal(layer(x), base(x)), layer.scale
    (True, 2.0)
    >>> [n for n, p in layer.named_parameters() if p.requires_grad]
    ['lora_A', 'lora_B']
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
        weight = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator)
        self.weight = nn.Parameter(weight, requires_grad=False)
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
        """A ``LoRALinear`` whose frozen weight and bias are copies of ``linear``'s.

        Raises:
            TypeError: ``linear`` is not an ``nn.Linear``.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear={type(linear).__name__} is invalid: from_linear takes an nn.Linear.")
        bias = linear.bias is not None
        layer = cls(linear.in_features, linear.out_features, rank=rank, alpha=alpha, bias=bias, generator=generator)
        layer = layer.to(device=linear.weight.device, dtype=linear.weight.dtype)
        layer.load_state_dict(linear.state_dict(), strict=False)  # weight and bias; the adapter stays
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, alpha={self.alpha:g}"
        )
