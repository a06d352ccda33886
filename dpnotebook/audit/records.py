"""Adversarial records and layouts for the sensitivity auditor.

A friendly batch of Gaussian inputs hides most privacy bugs: norms are
moderate, nothing cancels, every layer sees the same rows. The cases here are
the ones a reviewer of a DP library tries, each a small seeded model (a *layer
family*) and a batch with one *record* pattern in it:

* ``gaussian``: the friendly baseline;
* ``scale_1e4``: one sample's inputs (or, for token ids, its targets) times 1e4;
* ``zero_loss``: samples whose loss, hence gradient, is exactly zero;
* ``duplicated``: two identical samples;
* ``cancelling_copies``: a sample's ``K`` augmented copies pull in opposite directions;
* ``cancelling_positions``: two positions of one sample with nearly equal large
  inputs and opposite backprops (what breaks Gram-matrix norms in float32).

Each :class:`AuditCase` builds the model, the batch for any subset of samples
in either layout, and a dot-product loss ``<output, target>`` reduced over rows
as ``loss_reduction`` says, run in one or in two forward passes before one
backward.

>>> case = audit_case("mlp", "scale_1e4")
>>> x, t = case.batch([0, 2], K=2, batch_first=True)
>>> tuple(x.shape), tuple(t.shape)
((4, 6), (4, 3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.audit.families import FAMILIES, Family

__all__ = ["RECORDS", "AuditCase", "audit_case", "dot_loss_of"]

RECORDS = ("gaussian", "scale_1e4", "zero_loss", "duplicated", "cancelling_copies", "cancelling_positions")

#: Samples in every audited batch.
NUM_SAMPLES = 4
#: The most augmented copies a case prepares data for.
MAX_K = 4


def _apply_record(record: str, family: Family, x: Tensor, t: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Turn friendly data ``x`` ``[N, MAX_K, ...]`` and targets ``t`` into ``record``'s pattern."""
    x, t = x.clone(), t.clone()
    if record == "scale_1e4":
        if x.is_floating_point():
            x[1] *= 1e4
        else:
            t[1] *= 1e4
    elif record == "zero_loss":
        t[0] = 0
        t[2] = 0
    elif record == "duplicated":
        x[1], t[1] = x[0], t[0]
    elif record == "cancelling_copies":
        for k in range(MAX_K):  # copies alternate +t, -t, +t, ...; every copy sees the same input
            x[:, k] = x[:, 0]
            t[:, k] = t[:, 0] * (1 if k % 2 == 0 else -1)
    elif record == "cancelling_positions":
        if not family.sequence:
            raise ValueError(f"record 'cancelling_positions' needs a sequence family, not {family.name!r}.")
        if x.is_floating_point():  # positions 0 and 1: nearly equal inputs x 1000, opposite backprops
            v = torch.randn(x.shape[-1], generator=gen, dtype=x.dtype)
            x[0, :, 0] = 1000 * v
            x[0, :, 1] = 1000 * (v + 1e-4 * torch.randn(x.shape[-1], generator=gen, dtype=x.dtype))
        else:  # equal token ids: index matching must add them before squaring
            x[0, :, 1] = x[0, :, 0]
        t[0, :, 1] = -t[0, :, 0] * (1 + 1e-3)
        t[0, :, 0] *= 1000
        t[0, :, 1] *= 1000
    elif record != "gaussian":
        raise ValueError(f"record={record!r} is unknown; choose one of {RECORDS}.")
    return x, t


def _rows(data: Tensor, indices: list[int], K: int, batch_first: bool) -> Tensor:
    """The ``K`` copies of each sample in ``indices``, sample-major; time-major (rows in dim 1) unless ``batch_first``."""
    picked = data[indices, :K]  # [n, K, ...]
    rows = picked.reshape(len(indices) * K, *picked.shape[2:])
    return rows if batch_first else rows.transpose(0, 1)


def dot_loss_of(output: Tensor, target: Tensor, *, loss_reduction: str, rows: int) -> Tensor:
    """``<output, target>`` summed, or divided by the batch's ``rows`` for ``loss_reduction="mean"``.

    >>> dot_loss_of(torch.ones(4, 2), torch.ones(4, 2), loss_reduction="mean", rows=4)
    tensor(2.)
    """
    total = (output * target).sum()
    return total if loss_reduction == "sum" else total / max(rows, 1)


@dataclass
class AuditCase:
    """One layer family with one record pattern, ready for :func:`~dpnotebook.audit.audit_sensitivity`.

    Attributes:
        family: the model's :class:`~dpnotebook.audit.families.Family`.
        record: one of :data:`RECORDS`.
        inputs: ``[N, MAX_K, ...]`` inputs; targets: ``[N, MAX_K, ...]`` targets.
    """

    family: Family
    record: str
    inputs: Tensor
    targets: Tensor

    @property
    def name(self) -> str:
        return f"{self.family.name}/{self.record}"

    @property
    def num_samples(self) -> int:
        return self.inputs.shape[0]

    def model(self, batch_first: bool) -> nn.Module:
        """The family's model, seeded (the same weights on every call)."""
        torch.manual_seed(0)
        return self.family.make(batch_first)

    def batch(self, indices: list[int], *, K: int, batch_first: bool) -> tuple[Tensor, Tensor]:
        """``(inputs, targets)`` of the samples in ``indices``: ``K`` rows each, sample-major.

        A family with ``same_size_neighbours`` keeps every sample in the batch and
        zeroes the targets (so the loss and its gradient) of those not in ``indices``.
        """
        if K > MAX_K:
            raise ValueError(f"K={K} is more than the {MAX_K} copies a case prepares.")
        targets = self.targets
        if self.family.same_size_neighbours:
            weights = torch.zeros(self.num_samples, dtype=targets.dtype)
            weights[indices] = 1
            targets = targets * weights.view(-1, *[1] * (targets.dim() - 1))
            indices = list(range(self.num_samples))
        return _rows(self.inputs, indices, K, batch_first), _rows(
            targets, indices, K, batch_first or self.family.out_batch_first
        )

    def loss(
        self, *, loss_reduction: str, batch_first: bool, K: int, passes: int = 1
    ) -> Callable[[nn.Module, Any], Tensor]:
        """``loss(model, (x, t))``: the dot loss, over ``passes`` (1 or 2) forward passes before one backward.

        Two passes cut the batch on a sample boundary (a sample's ``K`` rows stay
        together); each pass's loss is reduced over its own rows, as the wrapper
        expects of a forward pass.
        """
        bd = 0 if batch_first else 1
        td = 0 if batch_first or self.family.out_batch_first else 1

        def run(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
            x, t = batch
            rows = x.shape[bd]
            cut = (rows // K // 2) * K if passes == 2 else rows
            pieces = [(0, cut), (cut, rows)] if 0 < cut < rows else [(0, rows)]
            total = None
            for a, b in pieces:
                out = model(x.narrow(bd, a, b - a))
                part = dot_loss_of(out, t.narrow(td, a, b - a), loss_reduction=loss_reduction, rows=b - a)
                total = part if total is None else total + part
            assert total is not None  # there is always at least one piece
            return total

        return run


def audit_case(family: str, record: str, *, num_samples: int = NUM_SAMPLES, seed: int = 0) -> AuditCase:
    """The seeded :class:`AuditCase` of ``family`` (a key of ``FAMILIES``) with ``record``."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is unknown; choose one of {sorted(FAMILIES)}.")
    fam = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    x, t = fam.data(num_samples, MAX_K, gen)
    x, t = _apply_record(record, fam, x, t, gen)
    return AuditCase(fam, record, x, t)
