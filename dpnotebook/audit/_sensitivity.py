"""The sensitivity auditor: how far can one sample move a DP-SGD step? (docs/guarantees.md, "How it is checked")

DP-SGD's noise is calibrated to one property of the clipped sum ``S(D)``: adding or removing one
sample moves it by at most ``C``. The auditor measures ``||S(D) - S(D without s)|| / C`` with the
library's own step (σ = 0), and compares ``S(D)`` with the float64 definition (:func:`reference_clipped_sum`).

>>> import torch
>>> from torch import nn
>>> data = torch.randn(4, 3)
>>> report = audit_sensitivity(
...     nn.Linear(3, 2), batch=lambda idx: data[idx],
...     loss=lambda model, x: model(x).pow(2).sum(), num_samples=4,
...     mode="hooks", loss_reduction="sum", max_grad_norm=0.1)
>>> report.ok(), report.reference_gap < 1e-5
(True, True)
>>> print(report.table())                                # doctest: +ELLIPSIS
sensitivity audit: mode=hooks K=1 loss_reduction=sum batch_first=True clipping=flat C=0.1
sample  ||S(D) - S(D\\{s})|| / C  parameter moved most
     0 ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from dpnotebook.modes import wrap_model
from dpnotebook.privacy._arguments import check_positive_int
from dpnotebook.privacy._mechanisms import check_layer_bounds, total_bound
from dpnotebook.privacy._optimizer import as_wrapper, optimizer_class, unwrap_model
from dpnotebook.testing import clean_copy

#: ``batch(indices)``: the batch holding those samples (each sample's ``K`` rows, sample-major).
MakeBatch = Callable[[list[int]], Any]
#: ``loss(model, batch)``: the loss to call ``backward()`` on.
LossOf = Callable[[nn.Module, Any], Tensor]

#: The relative slack allowed above C in float64: far above its rounding (the grid's float64 points
#: measure at most 3e-10 above C) and far below an overshoot that would move epsilon.
TOLERANCE = 1e-5
#: The slack in float32, where batched kernels round the other samples' gradients differently when
#: the batch changes (docs/guarantees.md, "Float32 and batched kernels").
FLOAT32_TOLERANCE = 1e-4


@dataclass
class SensitivityReport:
    """What :func:`audit_sensitivity` measured.

    Attributes:
        setting: the mode, ``K``, loss reduction, layout, clipping and ``C`` audited.
        ratios: for each sample ``s``, ``||S(D) - S(D without s)|| / C`` (``inf`` if non-finite).
        movers: for each sample, the parameter whose part of the difference was largest.
        nonfinite: the clipped sum of some subset held a NaN or an inf.
        reference_gap: ``||S(D) - S_ref(D)|| / C`` (``None`` if not asked for).
    """

    setting: dict[str, Any]
    ratios: list[float] = field(default_factory=list)
    movers: list[str] = field(default_factory=list)
    nonfinite: bool = False
    reference_gap: float | None = None

    @property
    def max_ratio(self) -> float:
        """The largest ratio to ``C`` over all samples (0.0 for an empty batch)."""
        return max(self.ratios, default=0.0)

    def ok(self, tolerance: float = TOLERANCE) -> bool:
        """Every sample moved the sum by at most ``C * (1 + tolerance)``, nothing was NaN or inf (not the reference).

        A step that is wrong but smaller (a row dropped, a data-dependent divisor) passes: read ``reference_gap``.
        """
        return not self.nonfinite and self.max_ratio <= 1 + tolerance

    def table(self) -> str:
        """A readable table: one row per sample, the worst marked."""
        head = " ".join(f"{k}={v}" for k, v in self.setting.items())
        lines = [f"sensitivity audit: {head}", "sample  ||S(D) - S(D\\{s})|| / C  parameter moved most"]
        for i, (r, name) in enumerate(zip(self.ratios, self.movers, strict=True)):
            lines.append(f"{i:>6}  {r:>22.6f}  {name}{'' if r <= 1 + TOLERANCE else '  <- over C'}")
        if self.nonfinite:
            lines.append("a clipped sum held NaN or inf")
        if self.reference_gap is not None:
            lines.append(f"||S(D) - S_ref(D)|| / C = {self.reference_gap:.3g} (S_ref: each sample alone, float64)")
        if not self.ratios:
            lines.append("(no samples)")
        return "\n".join(lines)

    __str__ = table


def reference_clipped_sum(
    model: nn.Module,
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    K: int,
    loss_reduction: str,
    clipping: str,
    max_grad_norm: float | list[float],
) -> list[Tensor]:
    """``S_ref(D)``: each sample's gradient alone (its ``K`` rows; ``/ K`` for a sum), in float64, clipped, summed.

    No grad sampler, wrapper or row bookkeeping is involved. Returns one tensor per trainable parameter.

    >>> data = torch.randn(3, 2)
    >>> ref = reference_clipped_sum(
    ...     nn.Linear(2, 1), batch=lambda idx: data[idx], loss=lambda model, x: model(x).sum(),
    ...     num_samples=3, K=1, loss_reduction="sum", clipping="flat", max_grad_norm=1e6)
    >>> [r.dtype for r in ref], torch.allclose(ref[1], torch.tensor([3.0], dtype=torch.float64))
    ([torch.float64, torch.float64], True)
    """
    from dpnotebook.privacy import clip_and_sum

    plain = clean_copy(model).to(torch.float64)
    params = [p for p in plain.parameters() if p.requires_grad]
    if not num_samples:
        return [torch.zeros_like(p) for p in params]
    to64 = partial(tree_map, lambda t: t.double() if isinstance(t, Tensor) and t.is_floating_point() else t)
    samples = []
    for i in range(num_samples):
        grads = torch.autograd.grad(loss(plain, to64(batch([i]))), params, allow_unused=True)
        samples.append(
            [
                torch.zeros_like(p) if g is None else g / (K if loss_reduction == "sum" else 1)
                for p, g in zip(params, grads, strict=True)
            ]
        )
    stacked = [torch.stack(rows) for rows in zip(*samples, strict=True)]
    return clip_and_sum(stacked, max_grad_norm=max_grad_norm, clipping=clipping).summed


def clipped_sum(wrapped: nn.Module, optimizer: Any, loss: LossOf, pieces: list[Any]) -> list[Tensor]:
    """``S``: ``loss`` and ``backward()`` on each piece of a logical batch, then the (σ = 0) optimizer's clipped sum.

    Every piece but the last is clipped by ``optimizer.virtual_step()``, as ``BatchMemoryManager`` does.
    Returns one float64 tensor per parameter of ``optimizer.params``.
    """
    optimizer.zero_grad()
    for i, batch in enumerate(pieces):
        value = loss(wrapped, batch)
        if value is not None:
            value.backward()
        if i < len(pieces) - 1:
            optimizer.virtual_step()
    optimizer.add_noise()
    sums = [p.grad.detach().to(torch.float64).clone() for p in optimizer.params]
    optimizer.zero_grad()
    return sums


def _audit(
    model: nn.Module,
    setting: dict[str, Any],
    batches_of: Callable[[list[int]], list[Any]],
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    reference: bool,
    distributed: bool = False,
) -> SensitivityReport:
    """Wrap a clean copy of ``model`` and measure every sample's ratio (``batches_of``: the pieces holding them)."""
    K, loss_reduction, clipping, bound = (setting[k] for k in ("K", "loss_reduction", "clipping", "C"))
    C = total_bound(check_layer_bounds(bound, clipping))  # a list of per-layer bounds: their total
    wrapped = wrap_model(
        clean_copy(model), setting["mode"], K=K, batch_first=setting["batch_first"], loss_reduction=loss_reduction
    )
    as_wrapper(wrapped).allow_grad_accumulation()  # a loss may run several forward passes before its backward
    params = [p for p in unwrap_model(wrapped).parameters() if p.requires_grad]
    cls = optimizer_class(getattr(wrapped, "grad_sample_mode", "hooks"))
    if distributed:
        from dpnotebook.privacy._distributed import distributed_optimizer_class

        cls = distributed_optimizer_class(cls)
    optimizer = cls(
        torch.optim.SGD(params, lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=bound,
        expected_batch_size=1.0,
        loss_reduction=loss_reduction,
        clipping=clipping,
        secure_mode=False,
    )
    report = SensitivityReport(setting)
    names = {id(p): n for n, p in unwrap_model(wrapped).named_parameters()}
    movers = [names.get(id(p), "?") for p in optimizer.params]
    everyone = list(range(num_samples))
    full = clipped_sum(wrapped, optimizer, loss, batches_of(everyone))
    report.nonfinite = not all(bool(torch.isfinite(s).all()) for s in full)
    for s in everyone:
        without = clipped_sum(wrapped, optimizer, loss, batches_of([i for i in everyone if i != s]))
        parts = [(a - b).norm() for a, b in zip(full, without, strict=True)]
        total = float(torch.stack(parts).norm()) if parts else 0.0
        report.nonfinite |= not math.isfinite(total)
        report.ratios.append(total / C if math.isfinite(total) else math.inf)
        worst = max(range(len(parts)), key=lambda i: float(parts[i].nan_to_num(math.inf))) if parts else None
        report.movers.append(movers[worst] if worst is not None else "-")
    as_wrapper(wrapped).to_standard_module()
    if reference:
        ref = reference_clipped_sum(
            model,
            batch=batch,
            loss=loss,
            num_samples=num_samples,
            K=K,
            loss_reduction=loss_reduction,
            clipping=clipping,
            max_grad_norm=bound,
        )
        gap = torch.stack([(a - b).norm() for a, b in zip(full, ref, strict=True)]).norm() if ref else torch.tensor(0.0)
        report.reference_gap = float(gap) / C
    return report


def audit_sensitivity(
    model: nn.Module,
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    mode: str = "hooks",
    K: int = 1,
    loss_reduction: str = "mean",
    batch_first: bool = True,
    clipping: str = "flat",
    max_grad_norm: float | list[float] = 1.0,
    reference: bool = True,
    physical_batch_size: int | None = None,
) -> SensitivityReport:
    """Measure ``max_s ||S(D) - S(D without s)|| / C`` with the library's real DP step (σ = 0).

    Args:
        model: the model; a clean copy is wrapped, so ``model`` itself is not touched.
        batch: ``batch(indices)``: the batch of those samples (each sample's ``K`` rows, sample-major).
        loss: ``loss(wrapped_model, batch)``: the loss to call ``backward()`` on.
        num_samples: ``B``, the samples in the full batch ``D``.
        mode, K, loss_reduction, batch_first, clipping: the setting audited.
        max_grad_norm: ``C`` (with ``clipping="per_layer"``, one bound per parameter; ``C`` is their total).
        reference: also compute ``reference_gap`` against :func:`reference_clipped_sum`.
        physical_batch_size: feed each logical batch in pieces of at most this many samples (``virtual_step``).

    Returns:
        A :class:`SensitivityReport`. An error the library raises (a refusal) propagates.
    """
    check_positive_int("num_samples", num_samples, minimum=0)
    if physical_batch_size is not None:
        check_positive_int("physical_batch_size", physical_batch_size)

    def pieces(indices: list[int]) -> list[Any]:
        size = physical_batch_size or max(len(indices), 1)
        return [batch(indices[i : i + size]) for i in range(0, max(len(indices), 1), size)]

    setting = dict(mode=mode, K=K, loss_reduction=loss_reduction, batch_first=batch_first, clipping=clipping)
    setting["C"] = max_grad_norm
    return _audit(model, setting, pieces, batch=batch, loss=loss, num_samples=num_samples, reference=reference)


def audit_sensitivity_across_ranks(
    model: nn.Module,
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    mode: str = "hooks",
    K: int = 1,
    loss_reduction: str = "mean",
    batch_first: bool = True,
    clipping: str = "flat",
    max_grad_norm: float = 1.0,
    reference: bool = True,
) -> SensitivityReport:
    """:func:`audit_sensitivity` in every process of a ``torch.distributed`` group, on the all-reduced sum.

    Sample ``i`` lives on rank ``i % world_size``; ``batch(indices)`` takes global indices (maybe none).
    Arguments as :func:`audit_sensitivity`; the report is the same on every rank.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("audit_sensitivity_across_ranks needs torch.distributed initialised in every rank.")
    rank, world = dist.get_rank(), dist.get_world_size()
    setting = dict(mode=mode, K=K, loss_reduction=loss_reduction, batch_first=batch_first, clipping=clipping)
    setting.update(C=max_grad_norm, world_size=world)

    def local(indices: list[int]) -> list[Any]:
        return [batch([i for i in indices if i % world == rank])]

    return _audit(
        model, setting, local, batch=batch, loss=loss, num_samples=num_samples, reference=reference, distributed=True
    )
