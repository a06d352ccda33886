"""Checks of tutorial 01 (per-sample gradients): norms without materialising, and the clipping factors.

``01.norm_without_materialising`` compares with the float64 definition and watches every tensor the
answer creates: one as large as the ``B`` per-sample gradients means they were built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from dpnotebook.exercises._core import ExerciseFailed, register_check, require


class _LargestTensor(TorchFunctionMode):
    """Records the most entries of any tensor a torch function returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _definition(a: Tensor, g: Tensor) -> Tensor:
    if a.dim() == 2:
        a, g = a[:, None], g[:, None]
    return torch.einsum("bto,bti->boi", g, a).flatten(1).norm(dim=1)


@register_check(
    "01.norm_without_materialising",
    todo="write linear_weight_norms(a, g): ‖g‖·‖a‖ for one position, "
    "then the Gram form Σ_ts (g_t·g_s)(a_t·a_s) for T positions",
)
def check_norms(linear_weight_norms: Callable[[Tensor, Tensor], Tensor]) -> str:
    """The norms for T = 1 and T = 3, against the materialised definition, and without materialising."""
    B, d_in, d_out = 4, 48, 40
    for T in (None, 3):
        lead = (B,) if T is None else (B, T)
        a, g = torch.randn(*lead, d_in, dtype=torch.float64), torch.randn(*lead, d_out, dtype=torch.float64)
        with _LargestTensor() as watch:
            got = linear_weight_norms(a, g)
        want = _definition(a, g)
        require(
            isinstance(got, Tensor) and got.shape == want.shape,
            f"return one norm per sample, a tensor of shape [{B}]; got "
            f"{list(got.shape) if isinstance(got, Tensor) else type(got).__name__}",
        )
        where = "for one position per sample (T = 1)" if T is None else f"for T = {T} positions"
        if torch.allclose(got, want.square(), rtol=1e-8):
            raise ExerciseFailed(f"squared norms {where}: take the square root")
        if T is not None:
            per_position = (g.norm(dim=2) * a.norm(dim=2)).sum(1)
            if torch.allclose(got, per_position, rtol=1e-8):
                raise ExerciseFailed(
                    "that is Σ_t ‖g_t‖‖a_t‖, the sum of the positions' norms; the norm of a sum "
                    "is smaller. Expand ‖Σ_t g_t a_tᵀ‖² = Σ_t Σ_s (g_t·g_s)(a_t·a_s): two [B, T, T] "
                    "Gram matrices, multiplied entrywise and summed"
                )
        require(
            torch.allclose(got, want, rtol=1e-8),
            f"the norms differ from the gradients' norms {where}: "
            "for one position ‖g aᵀ‖ = ‖g‖·‖a‖; for T positions use the Gram matrices",
        )
        if watch.largest >= B * d_in * d_out:
            raise ExerciseFailed(
                f"right numbers, but you built a tensor of {watch.largest} entries (the B per-sample "
                f"gradients have {B * d_in * d_out}): use ‖g‖·‖a‖, or the T×T Gram matrices"
            )
    return "‖g aᵀ‖ = ‖g‖‖a‖ and the Gram form agree with the gradients' norms; no [B, out, in] tensor was built"


@register_check(
    "01.per_sample_norms",
    todo="compute norms (one number per sample: the length of its whole gradient, every parameter together) "
    "and factors (the factor clipping at C multiplies each sample's gradient by)",
)
def check_per_sample_norms(norms: Tensor, factors: Tensor, oracle: dict[str, Tensor], C: float) -> str:
    """The per-sample norms of the oracle's gradients and the clipping factors at ``C``, against the library."""
    from dpnotebook.privacy import per_sample_norms

    want = per_sample_norms(list(oracle.values())).double()
    B = want.shape[0]
    require(isinstance(norms, Tensor), f"norms should be a tensor of {B} numbers, got {type(norms).__name__}")
    per_parameter = torch.stack([g.flatten(1).norm(dim=1) for g in oracle.values()]).double().cpu()
    if norms.shape in {per_parameter.shape, per_parameter.T.shape} and norms.numel() != B:
        raise ExerciseFailed(
            f"norms has shape {list(norms.shape)}: one norm per parameter and sample. DP-SGD clips each "
            f"sample's WHOLE gradient, all parameters together as one long vector: {B} numbers"
        )
    require(
        norms.shape == want.shape,
        f"norms should hold one number per sample, shape [{B}]; got {list(norms.shape)}",
    )
    got, want = norms.detach().double().cpu(), want.cpu()
    if torch.allclose(got, want.square(), rtol=1e-5):
        raise ExerciseFailed("those are squared norms: a norm is the square root of the sum of squares")
    if torch.allclose(got, per_parameter.sum(0), rtol=1e-5):
        raise ExerciseFailed(
            "that adds the parameters' norms; the length of one long vector made of all the parameters is not "
            "the sum of the pieces' lengths (Pythagoras: the squares add up, not the lengths)"
        )
    require(
        torch.allclose(got, want, rtol=1e-5),
        "the norms differ from dpnotebook.privacy.per_sample_norms: each sample's norm is the length of its "
        "gradient with every parameter's entries in one vector",
    )
    require(
        isinstance(factors, Tensor) and factors.shape == want.shape,
        f"factors should be a tensor of shape [{B}], one factor per sample"
        + ("" if isinstance(factors, Tensor) else f"; got {type(factors).__name__}"),
    )
    f = factors.detach().double().cpu()
    right = (C / want).clamp(max=1.0)
    if torch.allclose(f, want / C, rtol=1e-5) or torch.allclose(f, (want / C).clamp(max=1.0), rtol=1e-5):
        raise ExerciseFailed("the factor is upside down: a gradient of norm n, times the factor, must have norm <= C")
    if bool((f > 1 + 1e-9).any()):
        raise ExerciseFailed(
            "some factors are above 1, so they would make a short gradient longer: clipping only shrinks "
            "the gradients whose norm exceeds C and leaves the others as they are"
        )
    require(
        torch.allclose(f, right, rtol=1e-5),
        f"the factors differ: after clipping, a sample's gradient has norm min(its norm, C) with C = {C:g}",
    )
    shrunk = int((right < 1).sum())
    return (
        f"the norms match dpnotebook.privacy.per_sample_norms; clipping at C = {C:g} shrinks {shrunk} of {B} "
        f"samples and leaves {B - shrunk} as they are"
    )
