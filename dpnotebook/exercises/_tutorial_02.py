"""Checks of tutorial 02 (write a grad sampler): ``nn.Linear`` as an einsum, the ``Gate`` layer, a LoRA adapter.

Each check names the common mistake on float64 inputs (a missing ``/K``, a transposed result, positions
not summed, the chain-rule factor), then runs :func:`dpnotebook.testing.check_grad_sampler`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSamplerMismatch
from dpnotebook.exercises._core import ExerciseFailed, register_check, require
from dpnotebook.grad_sample import find_grad_sampler, register_grad_sampler, unregister_grad_sampler
from dpnotebook.testing import check_grad_sampler

Sampler = Callable[..., Any]


def _same(got: object, want: Tensor) -> bool:
    return isinstance(got, Tensor) and got.shape == want.shape and torch.allclose(got.double(), want, atol=1e-10)


def _call(sampler: Sampler, layer: nn.Module, x: Tensor, g: Tensor, K: int) -> dict[Any, Any]:
    result = sampler(layer, [x], g, K)
    require(
        isinstance(result, dict),
        f"the sampler returned a {type(result).__name__}: return a dict "
        "{parameter: per-sample gradients}, e.g. {layer.weight: ..., layer.bias: ...}",
    )
    return result


def _registered(sampler: Sampler, layer: nn.Module, name: str, layer_name: str) -> None:
    entry = find_grad_sampler(layer)
    require(
        entry is not None and entry.fn is sampler,
        f"{name} is not the sampler registered for {layer_name}: "
        f"decorate it with @register_grad_sampler({layer_name}) and run its cell again",
    )


def _oracle(cases: Iterable[tuple[nn.Module, Tensor, int, bool]]) -> None:
    """``check_grad_sampler`` on each ``(layer, input, K, batch_first)``."""
    try:
        for layer, x, K, batch_first in cases:
            check_grad_sampler(layer, x, K=K, batch_first=batch_first)
    except GradSamplerMismatch as err:
        raise ExerciseFailed(f"the direct tests pass but the oracle disagrees: {str(err).splitlines()[0]}") from None


def _k_times(K: int, *pairs: tuple[Any, Tensor]) -> None:
    if K > 1 and any(_same(got, want * K) for got, want in pairs):
        raise ExerciseFailed("K times too large: average the K copies of each sample (divide by K)")


class _StudentLinear(nn.Linear):
    """A Linear of its own type, so the student's sampler is registered without replacing the built-in one."""


@register_check(
    "02.linear_einsum",
    todo="write linear_sampler(layer, activations, backprops, K) with one "
    "torch.einsum for the weight and a sum for the bias; remember the K copies",
)
def check_linear_einsum(sampler: Sampler) -> str:
    """The student's ``nn.Linear`` sampler: named mistakes first, then the oracle."""
    layer = nn.Linear(4, 3).double()
    for K, shape in [(1, (5, 4)), (1, (5, 6, 4)), (3, (6, 2, 4))]:
        x = torch.randn(*shape, dtype=torch.float64)
        g = torch.randn(*shape[:-1], 3, dtype=torch.float64)
        result = _call(sampler, layer, x, g, K)
        require(layer.weight in result, "the dict has no entry for layer.weight")
        require(
            layer.bias in result,
            "the dict has no entry for layer.bias: its per-sample gradient is the "
            "backprops summed over positions (and averaged over the K copies)",
        )
        B = shape[0] // K
        a, b = x.reshape(B, -1, 4), g.reshape(B, -1, 3)
        weight, bias, got = torch.einsum("bto,bti->boi", b, a) / K, b.sum(1) / K, result[layer.weight]
        require(isinstance(got, Tensor), "the weight's entry is not a tensor")
        if got.shape == weight.transpose(1, 2).shape and got.shape != weight.shape:
            raise ExerciseFailed(
                f"the weight gradients have shape {list(got.shape)}, transposed: the weight is "
                "[out, in], so each sample's gradient is g aᵀ, e.g. einsum('bto,bti->boi', g, a)"
            )
        if K > 1 and got.shape[0] == B * K:
            raise ExerciseFailed(
                f"{got.shape[0]} gradients for {B} samples: one per row, not per sample; reshape "
                "the B·K rows to [B, K·T, features] so the copies are summed, then divide by K"
            )
        require(
            got.shape == weight.shape,
            f"the weight gradients have shape {list(got.shape)}, expected "
            f"{list(weight.shape)} = [B, out_features, in_features]",
        )
        _k_times(K, (got, weight))
        if len(shape) == 3 and not _same(got, weight):
            raise ExerciseFailed(
                "right for one position per row, wrong for sequences: sum g_t a_tᵀ over the "
                "positions t too (reshape to [B, K·T, features] and contract over that dim)"
            )
        require(
            _same(got, weight),
            "the weight gradients differ from g aᵀ: for one row, the gradient of "
            "y = W a is the outer product of the backprops g [out] with the activations a [in]",
        )
        require(
            _same(result[layer.bias], bias),
            "the weight is right, the bias is not: its gradient is the backprops summed over positions, divided by K",
        )
    register_grad_sampler(_StudentLinear)(sampler)
    try:
        _oracle(
            (_StudentLinear(4, 3), torch.randn(shape), K, batch_first)
            for K, shape, batch_first in [(1, (4, 4), True), (2, (6, 3, 4), True), (2, (5, 6, 4), False)]
        )
    finally:
        unregister_grad_sampler(_StudentLinear)
    return "matches the float64 oracle for K=1 and 2, with and without positions, batch_first=False too"


@register_check("02.gate_sampler", todo="derive d loss / d w_j, complete gate_sampler (with K) and run its cell")
def check_gate_sampler(sampler: Sampler, layer_type: type[nn.Module]) -> str:
    """The student's ``Gate`` sampler (``layer_type`` is the notebook's ``Gate`` class)."""
    _registered(sampler, layer_type(3), "gate_sampler", "Gate")
    layer = layer_type(5).double()
    for K in (1, 3):
        x, g = torch.randn(2, 2 * K, 7, 5, dtype=torch.float64)  # activations and backprops
        result = _call(sampler, layer, x, g, K)
        require(layer.w in result, "the dict has no entry for layer.w")
        through = (g * x).reshape(2, -1, 5).sum(1) / K  # d loss / d (sigmoid(w)) per sample
        s = torch.sigmoid(cast(Tensor, layer.w).detach())  # the notebook's Gate: w is its Parameter
        got = result[layer.w]
        right = through * s * (1 - s)
        require(
            isinstance(got, Tensor) and got.shape == right.shape,
            f"layer.w's per-sample gradients should have shape {list(right.shape)} = [B, features]",
        )
        if _same(got, through):
            raise ExerciseFailed(
                "you have d loss / d sigmoid(w); the chain rule multiplies by sigmoid'(w) = sigmoid(w)(1 - sigmoid(w))"
            )
        if _same(got, through * s):
            raise ExerciseFailed(
                "that is the gradient with respect to sigmoid(w) times sigmoid(w); the "
                "derivative is sigmoid(w)(1 - sigmoid(w))"
            )
        _k_times(K, (got, right))
        require(
            _same(got, right),
            "the gradients differ from sum_t g_t x_t σ(w)(1 - σ(w)) / K: check the sum over positions and copies",
        )
    _oracle((layer_type(5), torch.randn(2 * K, 7, 5), K, True) for K in (1, 3))
    return "gate_sampler matches the float64 oracle for K=1 and K=3"


@register_check(
    "02.lora_sampler",
    todo="derive the per-sample gradients of A and B (h = A a is what B sees; "
    "Bᵀ g is what reaches A), then complete lora_sampler",
)
def check_lora_sampler(sampler: Sampler, layer_type: type[nn.Module]) -> str:
    """The student's sampler for a low-rank adapter ``y = W a + B (A a)`` (``layer_type(in, out, rank)``)."""
    _registered(sampler, layer_type(4, 3, 2), "lora_sampler", "LoRALinear")
    layer = layer_type(5, 4, 2).double()
    with torch.no_grad():
        cast(Tensor, layer.B).normal_()  # B = 0 at initialisation would hide a wrong gradient for A
    for K in (1, 3):
        x = torch.randn(2 * K, 6, 5, dtype=torch.float64)
        g = torch.randn(2 * K, 6, 4, dtype=torch.float64)
        result = _call(sampler, layer, x, g, K)
        require(
            layer.A in result and layer.B in result,
            "return a dict with an entry for layer.A and for layer.B (the frozen weight is a buffer: no gradient)",
        )
        B = x.shape[0] // K
        a, gg = x.reshape(B, -1, 5), g.reshape(B, -1, 4)
        lora_a, lora_b = cast(Tensor, layer.A), cast(Tensor, layer.B)  # the notebook's LoRA layer: its Parameters
        h = a @ lora_a.detach().T  # [B, K*T, rank]
        want_b = torch.einsum("bno,bnr->bor", gg, h) / K
        want_a = torch.einsum("bnr,bni->bri", gg @ lora_b.detach(), a) / K
        got_a, got_b = result[layer.A], result[layer.B]
        require(
            isinstance(got_b, Tensor) and got_b.shape == want_b.shape,
            f"layer.B's per-sample gradients should have shape {list(want_b.shape)} = [B, out, rank]",
        )
        require(
            isinstance(got_a, Tensor) and got_a.shape == want_a.shape,
            f"layer.A's per-sample gradients should have shape {list(want_a.shape)} = [B, rank, in]",
        )
        _k_times(K, (got_a, want_a), (got_b, want_b))
        if not _same(got_b, want_b):
            raise ExerciseFailed(
                "layer.B's gradients are wrong: B is a linear layer whose input is the adapter's "
                "hidden h_t = A a_t, so its gradient is Σ_t g_t h_tᵀ (not g_t a_tᵀ)"
            )
        if not _same(got_a, want_a):
            raise ExerciseFailed(
                "layer.A's gradients are wrong: the backprops reach A through B, as Bᵀ g_t, so "
                "its gradient is Σ_t (Bᵀ g_t) a_tᵀ"
            )
    _oracle((layer_type(5, 4, 2), torch.randn(2 * K, 6, 5), K, True) for K in (1, 3))
    return "lora_sampler matches the float64 oracle for K=1 and K=3"
