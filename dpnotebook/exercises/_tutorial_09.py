"""Checks of tutorial 09 (DP-SGD from scratch): per-layer clipping and noise, against the library's per-layer
:func:`~dpnotebook.privacy.clip_and_sum` and the optimizer's noise, first without noise, then with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dpnotebook.exercises._core import ExerciseFailed, register_check, require
from dpnotebook.privacy import clip_and_sum

C, SIGMA, EXPECTED = 0.5, 2.0, 8.0  # C != 1 tells sigma from sigma * C; 8 expected vs 6 drawn tells the two apart


def _grads(big: int = 0) -> list[Tensor]:
    """Per-sample gradients of 3 parameters for 6 samples: some layers far above C / sqrt(3), some below."""
    g = torch.Generator().manual_seed(9)
    shapes = [(4, 3), (4,), (2, big or 2)]
    grads = [torch.randn(6, *s, generator=g, dtype=torch.float64) * 0.05 for s in shapes]
    grads[0][0] *= 200.0  # sample 0: only its first layer is large
    grads[1][2] *= 100.0  # sample 2: only its second layer
    for p in grads:
        p[4] *= 300.0  # sample 4: every layer
    return grads


def _close(got: list[Tensor], want: list[Tensor]) -> bool:
    return all(torch.allclose(a.to(torch.float64), b, rtol=1e-6, atol=1e-9) for a, b in zip(got, want, strict=True))


def _call(fn: Callable[..., Any], grads: list[Tensor], sigma: float, seed: int) -> list[Tensor]:
    out = fn(
        [g.clone() for g in grads],
        C=C,
        sigma=sigma,
        expected_batch_size=EXPECTED,
        generator=torch.Generator().manual_seed(seed),
    )
    out = list(out) if isinstance(out, (list, tuple)) else None
    require(
        out is not None and len(out) == len(grads),
        f"return a list with one tensor per parameter ({len(grads)} here), in the order of grads",
    )
    assert out is not None  # require raised otherwise
    for o, g in zip(out, grads, strict=True):
        require(
            isinstance(o, Tensor) and tuple(o.shape) == tuple(g.shape[1:]),
            f"each result must have the parameter's shape {tuple(g.shape[1:])}, without the batch dim "
            f"(got {tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__}): sum over the samples",
        )
    return out


def _diagnose_clipping(got: list[Tensor], grads: list[Tensor]) -> str:
    L, B = len(grads), grads[0].shape[0]
    per_layer = clip_and_sum(grads, max_grad_norm=C, clipping="per_layer").summed
    wrong = {
        f"each layer was clipped to C, not to C / sqrt(L) = C / sqrt({L}): one sample could then move the sum "
        f"by sqrt({L}) * C, more than the noise is calibrated to": [
            s / EXPECTED for s in clip_and_sum(grads, max_grad_norm=C * math.sqrt(L), clipping="per_layer").summed
        ],
        "that is flat clipping (one norm over all layers); clip each layer on its own, to C / sqrt(L)": [
            s / EXPECTED for s in clip_and_sum(grads, max_grad_norm=C, clipping="flat").summed
        ],
        f"you divided by the {B} samples drawn; divide by expected_batch_size: the drawn size depends on "
        "who is in the data and would leak it": [s / B for s in per_layer],
        "nothing was clipped: scale each layer of each sample down to norm C / sqrt(L) when it is larger": [
            g.sum(0) / EXPECTED for g in grads
        ],
        "you forgot to divide by expected_batch_size": per_layer,
    }
    for hint, candidate in wrong.items():
        if _close(got, candidate):
            return hint
    return (
        "with sigma=0 the result should be the per-layer clipped sum divided by expected_batch_size; "
        "compare yours with dpnotebook.privacy.clip_and_sum(grads, max_grad_norm=C, clipping='per_layer')"
    )


@register_check(
    "09.per_layer_privatize",
    todo="write privatize_per_layer: clip each layer to C / sqrt(L), sum, add N(0, (sigma C)^2) "
    "per parameter, divide by expected_batch_size",
)
def check_per_layer_privatize(privatize_per_layer: Callable[..., Any]) -> str:
    """Compare ``privatize_per_layer`` with the library, without noise, then with it."""
    grads = _grads()
    summed = clip_and_sum(grads, max_grad_norm=C, clipping="per_layer").summed
    got = _call(privatize_per_layer, grads, 0.0, seed=0)
    if not _close(got, [s / EXPECTED for s in summed]):
        raise ExerciseFailed(_diagnose_clipping(got, grads))
    got = _call(privatize_per_layer, grads, SIGMA, seed=5)
    generator = torch.Generator().manual_seed(5)
    want = [(s + torch.normal(0.0, SIGMA * C, s.shape, generator=generator, dtype=s.dtype)) / EXPECTED for s in summed]
    if _close(got, want):
        return 'the same noisy average as clip_and_sum(clipping="per_layer") and the optimizer\'s noise'
    # Another draw order is fine if the noise has the right size: measure it on a large parameter.
    big = _grads(big=20_000)
    big_summed = clip_and_sum(big, max_grad_norm=C, clipping="per_layer").summed
    noise = (_call(privatize_per_layer, big, SIGMA, seed=7)[2].to(torch.float64) - big_summed[2] / EXPECTED) * EXPECTED
    std = float(noise.std())
    for hint, value in (
        ("the noise std is sigma; it must be sigma * C (the sensitivity is C)", SIGMA),
        (
            "the noise was added after dividing by expected_batch_size: add it to the sum, then divide",
            SIGMA * C * EXPECTED,
        ),
        ("there is no noise (or almost none): add torch.normal(0.0, sigma * C, shape) to each parameter's sum", 0.0),
    ):
        if abs(std - value) <= 0.05 * SIGMA * C:
            raise ExerciseFailed(hint)
    require(
        abs(std - SIGMA * C) <= 0.05 * SIGMA * C,
        f"the noise on the sum has std {std:.3g}; it should be sigma * C = {SIGMA * C:g}",
    )
    return "right clipping and noise of std sigma * C (drawn in another order than the library's, which is fine)"
