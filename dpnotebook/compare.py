"""Compare the grad-sample modes on one model: do they agree with the oracle, and what do they cost?

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> rows = compare_modes(nn.Linear(4, 3), torch.randn(6, 4), torch.randint(0, 3, (6,)), repeats=1)
>>> [r.mode for r in rows][:3], all(r.agrees for r in rows)
(['oracle', 'ew', 'functorch'], True)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.accumulation import grad_sample_rows
from dpnotebook.grad_sample.samplers._contracts import flat_rows
from dpnotebook.modes import available_modes, wrap_model
from dpnotebook.testing import clean_copy, reference_grad_samples

__all__ = [
    "ModeComparison",
    "compare_modes",
    "median_seconds",
    "mode_result",
    "error_against",
    "agreement_tolerance",
    "tf32_allowed",
]

#: Relative error counted as agreement: float32 arithmetic, and TF32 (the GPU's matrix units rounding float32
#: inputs to 10 bits of mantissa, about 5e-4 each, which PyTorch allows by default in cuDNN's convolutions
#: and recurrences).
FLOAT32_TOLERANCE, TF32_TOLERANCE = 1e-4, 1e-2

LossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ModeComparison:
    """One mode (or ``"oracle"``) on one batch: its :func:`error_against` the oracle, the median
    milliseconds of one forward+backward, whether the error is within the tolerance, and the mode's
    error message when it refused the model."""

    mode: str
    max_error: float
    ms: float
    agrees: bool
    error: str = ""


def median_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mode_result(wrapped: nn.Module, model: nn.Module) -> dict[str, Tensor | None] | Tensor:
    """What a mode computed after backward: ``{name: grad_sample}``, or ``[B]`` norms for a norms-only mode."""
    grads: dict[str, Tensor | None] = {n: grad_sample_rows(p) for n, p in model.named_parameters() if p.requires_grad}
    per_sample_norms: Callable[[], Tensor] | None = getattr(wrapped, "per_sample_norms", None)
    if any(g is None for g in grads.values()) and per_sample_norms is not None:
        return per_sample_norms()
    return grads


def error_against(result: Mapping[str, Tensor | None] | Tensor, ref: dict[str, Tensor]) -> float:
    """Largest difference from the oracle, relative to its largest entry (``inf`` if something is missing);
    for per-sample norms (a norms-only mode such as ``"ghost"``), from the oracle's norms.

    >>> import torch
    >>> ref = {"w": torch.tensor([[3.0, 4.0]], dtype=torch.float64)}
    >>> error_against(torch.tensor([5.0]), ref), error_against({"w": None}, ref)
    (0.0, inf)
    >>> error_against(torch.tensor([5.0]), {"w": ref["w"], "t": torch.zeros(1, dtype=torch.float64)})  # a 0-d parameter
    0.0
    """
    if isinstance(result, Tensor):  # per-sample norms only
        norms = torch.cat([flat_rows(r) for r in ref.values()], dim=1).norm(dim=1)
        scale = norms.abs().max().item() if norms.numel() else 1.0
        diff = (result.double() - norms).abs().max().item() if norms.numel() else 0.0
        return diff / (scale or 1.0)
    got = {n: result.get(n) for n in ref}
    if any(g is None or g.shape != r.shape for g, r in zip(got.values(), ref.values(), strict=True)):
        return float("inf")
    scale = max((r.abs().max().item() for r in ref.values() if r.numel()), default=1.0) or 1.0
    return (
        max(((cast(Tensor, got[n]).double() - r).abs().max().item() for n, r in ref.items() if r.numel()), default=0.0)
        / scale
    )


def agreement_tolerance(model: nn.Module) -> float:
    """The relative error up to which a mode agrees with the float64 oracle on ``model``: float32's,
    or TF32's where a float32 parameter lies on a CUDA GPU that PyTorch lets round to TF32.

    >>> from torch import nn
    >>> agreement_tolerance(nn.Linear(2, 2))
    0.0001
    """
    on_tf32 = any(p.is_cuda and p.dtype == torch.float32 for p in model.parameters())
    return TF32_TOLERANCE if on_tf32 and tf32_allowed() else FLOAT32_TOLERANCE


def tf32_allowed() -> bool:
    """Whether PyTorch may round float32 to TF32 on a GPU (cuDNN's default; matrix products' if asked)."""
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


def compare_modes(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    loss_fn: LossFn = F.cross_entropy,
    *,
    K: int = 1,
    modes: list[str] | None = None,
    repeats: int = 3,
    tolerance: float | None = None,
) -> list[ModeComparison]:
    """Per-sample gradients of ``model`` on one batch in every mode, against the oracle.

    Args:
        model: a plain module (copied for each mode; never changed).
        inputs: ``B*K`` rows, sample-major, and ``targets`` one per row.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over rows.
        K: augmentation multiplicity.
        modes: which modes (default: all registered).
        repeats: timed repetitions per mode (median reported).
        tolerance: largest relative error counted as agreement; by default :func:`agreement_tolerance`
            (1e-4 for float32, 1e-2 where a GPU may round float32 to TF32).

    Returns:
        The oracle first, then one :class:`ModeComparison` per mode.
    """

    def oracle() -> dict[str, Tensor]:  # one row each: its mean loss times 1 row is its summed loss
        return reference_grad_samples(model, [inputs], target=targets, loss_fn=loss_fn, K=K)

    tolerance = agreement_tolerance(model) if tolerance is None else tolerance
    ref = oracle()
    results = [ModeComparison("oracle", 0.0, median_seconds(oracle, repeats=1) * 1e3, True)]
    for mode in modes or available_modes():
        copy_ = clean_copy(model)
        try:
            wrapped = wrap_model(copy_, mode, K=K)

            def step(wrapped: nn.Module = wrapped, copy_: nn.Module = copy_) -> dict[str, Tensor | None] | Tensor:
                wrapped.zero_grad()  # this mode's model: bound now, not looked up when called
                loss_fn(wrapped(inputs), targets).backward()
                return mode_result(wrapped, copy_)

            got = step()
            seconds = median_seconds(step, repeats)
        except Exception as err:  # noqa: BLE001 - a refusal is a result worth showing
            results.append(ModeComparison(mode, float("nan"), float("nan"), False, str(err).splitlines()[0]))
            continue
        error = error_against(got, ref)
        results.append(ModeComparison(mode, error, seconds * 1e3, error <= tolerance))
    return results
