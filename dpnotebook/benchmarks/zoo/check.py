"""A zoo model in a grad-sample mode against the float64 oracle: its error and its fallback units.

:func:`check_zoo_model` fixes the model for the mode (:func:`dpnotebook.fix`),
validates it, runs one batch through the mode's wrapper and compares with
:func:`~dpnotebook.testing.reference_grad_samples`:

* modes that fill ``p.grad_sample`` (hooks, functorch, ew) are compared per
  sample and per parameter;
* a mode whose wrapper forms only norms and clipped sums (ghost, its wrapper
  has ``weighted_sums``) is compared by the per-sample norms and the clipped
  sums of ``clip_and_sum`` with the clipping bound at the oracle's median norm
  (some samples clipped, some not).

The error is relative: ``max |got - oracle| / max |oracle|`` over all parameters.

>>> result = check_zoo_model("resnet", "hooks", rows=2)
>>> result.max_rel_err < 1e-10, result.fallback, result.whole_model
(True, [], False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

import dpnotebook
from dpnotebook.benchmarks.zoo import build
from dpnotebook.mode_registry import Unwrappable
from dpnotebook.privacy import clip_and_sum, clip_factors
from dpnotebook.testing import clean_copy, dot_loss, random_target, reference_grad_samples


@dataclass
class ZooCheck:
    """What :func:`check_zoo_model` found.

    Attributes:
        max_rel_err: largest ``|got - oracle|`` over the largest ``|oracle|`` entry.
        units: the wrapper's ``(path, how)`` units (empty for a mode without units, e.g. ew).
        fallback: the paths of the ``torch.func`` units.
        whole_model: whether one ``torch.func`` unit is the whole model.
    """

    max_rel_err: float
    units: list[tuple[str, str]] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)
    whole_model: bool = False


def prepared(name: str, mode: str, *, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Module:
    """The zoo model ``name`` after ``dpnotebook.fix`` for ``mode``, checked clean by ``dpnotebook.validate``.

    Raises:
        AssertionError: ``validate`` still reports problems after ``fix``.
    """
    fixed = dpnotebook.fix(build(name, seed=seed, dtype=dtype).model, mode=mode)
    problems = dpnotebook.validate(fixed, mode=mode)
    assert not problems, f"{name} after fix, mode {mode!r}: {problems}"
    return fixed


def _cast(inputs: tuple[Tensor, ...], dtype: torch.dtype) -> tuple[Tensor, ...]:
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def _units(wrapped: nn.Module) -> list[tuple[str, str]]:
    return list(getattr(wrapped, "units", []))


def check_zoo_model(
    name: str, mode: str, *, K: int = 1, rows: int = 3, dtype: torch.dtype = torch.float64, seed: int = 0
) -> ZooCheck:
    """Fix, validate, wrap and run zoo model ``name`` in ``mode`` on ``rows`` samples of ``K`` rows.

    Args:
        name: a zoo model (:data:`~dpnotebook.benchmarks.zoo.ZOO`).
        mode: a grad-sample mode (:func:`dpnotebook.available_modes`).
        K: rows per sample.
        rows: samples B.
        dtype: the dtype the mode runs in (the oracle is always float64).
        seed: seeds the weights and the batch.

    Raises:
        GradSampleError, UnsupportedModuleError: the mode refuses the model (the message says why).
    """
    model = prepared(name, mode, dtype=torch.float64, seed=seed)
    inputs, _ = build(name).batch(rows * K, seed=seed + 1)
    inputs64 = _cast(inputs, torch.float64)
    target = random_target(model, inputs64)
    ref = reference_grad_samples(model, inputs64, target=target, K=K)
    copy_ = clean_copy(model).to(dtype)
    wrapped = dpnotebook.wrap_model(copy_, mode, K=K, loss_reduction="sum")
    try:
        dot_loss(wrapped(*_cast(inputs, dtype)), target.to(dtype)).backward()
        named = [(n, p) for n, p in copy_.named_parameters() if p.requires_grad]
        if hasattr(wrapped, "weighted_sums"):
            err = _clipped_sum_error(wrapped, named, ref)
        else:
            err = _grad_sample_error(named, ref)
        units = _units(wrapped)
    finally:
        cast(Unwrappable, wrapped).to_standard_module()  # every mode's wrapper has it
    return _result(err, units)


def _result(err: float, units: list[tuple[str, str]]) -> ZooCheck:
    fallback = [p for p, how in units if how == "torch.func"]
    return ZooCheck(err, units, fallback, "model" in fallback)


def units_after_a_step(name: str, mode: str, *, rows: int = 2) -> ZooCheck:
    """The units of zoo model ``name`` in ``mode`` after one forward and backward pass (no oracle: ``max_rel_err`` is NaN).

    >>> units_after_a_step("vit", "functorch").units
    [('model', 'torch.func')]
    """
    model = prepared(name, mode, dtype=torch.float32)
    case = build(name)
    inputs, targets = case.batch(rows)
    wrapped = dpnotebook.wrap_model(model, mode)
    try:
        case.loss(wrapped(*inputs), targets).backward()
        units = _units(wrapped)
    finally:
        cast(Unwrappable, wrapped).to_standard_module()
    return _result(math.nan, units)


def _grad_sample_error(named: list[tuple[str, nn.Parameter]], ref: dict[str, Tensor]) -> float:
    scale = max(r.abs().max().item() for r in ref.values())
    err = 0.0
    for n, p in named:
        got = getattr(p, "grad_sample", None)
        if got is None or got.shape != ref[n].shape:
            shape = None if got is None else tuple(got.shape)
            raise AssertionError(f"{n}: grad_sample {shape}, the oracle's {tuple(ref[n].shape)}")
        err = max(err, (got.double() - ref[n]).abs().max().item())
    return err / scale


def _clipped_sum_error(wrapped: Any, named: list[tuple[str, nn.Parameter]], ref: dict[str, Tensor]) -> float:
    oracle_norms = clip_and_sum([ref[n] for n, _ in named], max_grad_norm=float("inf")).norms
    C = float(oracle_norms.median())
    oracle = clip_and_sum([ref[n] for n, _ in named], max_grad_norm=C)
    norms = wrapped.per_sample_norms().double()
    sums = wrapped.weighted_sums(clip_factors(norms, C))
    scale = float(oracle.norms.max())
    err = (norms - oracle.norms).abs().max().item()
    for (_, p), want in zip(named, oracle.summed, strict=True):
        got = sums.get(p, torch.zeros_like(p)).double()
        err = max(err, (got - want).abs().max().item())
    return err / scale


__all__ = ["check_zoo_model", "units_after_a_step", "prepared", "ZooCheck"]
