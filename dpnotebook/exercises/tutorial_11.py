"""Checkers for tutorial 11 (public pretraining, private training).

``11.lora_sampler``: the student's grad sampler for
:class:`~dpnotebook.layers.lora.LoRALinear`, ``fn(layer, activations, backprops, K)``,
is compared with the float64 oracle :func:`dpnotebook.testing.reference_grad_samples`
for ``K`` in 1 and 3, with and without a sequence dimension.

>>> from dpnotebook.grad_sample.samplers.lora import lora_grad_sampler
>>> check_lora_sampler(lora_grad_sampler)
'matches the float64 oracle for K = 1 and 3, with and without positions'
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from dpnotebook.exercises.core import ExerciseFailed, register_check, require
from dpnotebook.layers.lora import LoRALinear
from dpnotebook.testing import reference_grad_samples

__all__ = ["check_lora_sampler"]


def _layer() -> LoRALinear:
    layer = LoRALinear(5, 4, rank=2, alpha=5.0, generator=torch.Generator().manual_seed(0)).to(torch.float64)
    with torch.no_grad():  # a non-zero B, so that A's gradient is not zero
        layer.lora_B.normal_(generator=torch.Generator().manual_seed(1))
    return layer


def _ratio(got: Tensor, want: Tensor) -> float:
    return float((got.detach() * want).sum() / (want * want).sum())


@register_check(
    "11.lora_sampler",
    todo="write my_lora_sampler(layer, activations, backprops, K) returning "
    "{layer.lora_A: [B, r, in], layer.lora_B: [B, out, r]}",
)
def check_lora_sampler(my_lora_sampler: Callable) -> str:
    """Run the student's sampler on recorded activations and backprops; compare with the oracle."""
    for K, positions in ((1, ()), (3, ()), (3, (2,))):
        layer = _layer()
        g = torch.Generator().manual_seed(10 * K + len(positions))
        x = torch.randn(4 * K, *positions, 5, generator=g, dtype=torch.float64)
        backprops = torch.randn(4 * K, *positions, 4, generator=g, dtype=torch.float64)
        # the oracle's loss sum(output * target) has exactly these backprops: one row at a time, in float64
        want = reference_grad_samples(layer, [x], target=backprops, K=K)
        got = my_lora_sampler(layer, [x], backprops, K)
        require(isinstance(got, dict), f"return a dict {{parameter: per-sample gradient}}, got {type(got).__name__}")
        extra = [n for n, p in layer.named_parameters() if not p.requires_grad and any(q is p for q in got)]
        require(not extra, f"{extra} are frozen: return per-sample gradients only for lora_A and lora_B")
        for name in ("lora_A", "lora_B"):
            p = getattr(layer, name)
            require(p in got, f"no entry for layer.{name}: key the dict by the parameter itself, layer.{name}")
            mine, ref = got[p], want[name]
            require(
                isinstance(mine, Tensor) and tuple(mine.shape) == tuple(ref.shape),
                f"layer.{name}: shape {tuple(mine.shape) if isinstance(mine, Tensor) else type(mine).__name__}, "
                f"expected [B, *{name}.shape] = {tuple(ref.shape)} (B = rows / K = {x.shape[0] // K})",
            )
            if torch.allclose(mine.to(torch.float64), ref, rtol=1e-6, atol=1e-9):
                continue
            ratio = _ratio(mine.to(torch.float64), ref)
            where = f"layer.{name} (K={K}{', with a position dim' if positions else ''})"
            if abs(ratio * layer.scale - 1) < 1e-3:
                raise ExerciseFailed(
                    f"{where} is off by the factor alpha / r = {layer.scale:g}: multiply by layer.scale"
                )
            if abs(ratio - layer.scale) < 1e-3:
                raise ExerciseFailed(f"{where} has the factor alpha / r = {layer.scale:g} twice")
            if K > 1 and abs(ratio - K) < 1e-3:
                raise ExerciseFailed(
                    f"{where} is K = {K} times too large: a sample's gradient is the MEAN over its "
                    "K rows, divide the sum by K"
                )
            if K > 1 and abs(ratio * K - 1) < 1e-3:
                raise ExerciseFailed(f"{where} is divided by K twice")
            raise ExerciseFailed(
                f"{where} differs from the oracle (largest error {float((mine.detach() - ref).abs().max()):.3g}); "
                "dL/dB = s * sum_t g_t (A x_t)^T and dL/dA = s * sum_t (B^T g_t) x_t^T, summed over a sample's "
                "rows and positions, divided by K"
            )
    return "matches the float64 oracle for K = 1 and 3, with and without positions"
