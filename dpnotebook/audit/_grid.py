"""The adversarial grid: every mode x layer family x record x K x reduction x layout x clipping.

:func:`grid` lists the points, :func:`run_point` audits one with :func:`~dpnotebook.audit.audit_sensitivity`,
and :data:`REFUSALS` says which points the library refuses by design, with the error it must raise.
Every other point must keep the bound and match the float64 definition (:func:`matches`);
:func:`summarise` counts the outcomes per mode. ``python -m dpnotebook.audit`` runs the whole grid.

>>> points = list(grid(modes=["hooks"], families=["mlp"], records=["gaussian"]))
>>> len(points), points[0].name
(12, 'hooks mlp/gaussian K=1 mean flat batch_first passes=1 float64')
>>> outcomes = [run_point(p) for p in points]
>>> outcomes[0].status, outcomes[0].report.ok()
('bounded', True)
>>> print(summarise(outcomes))                      # doctest: +ELLIPSIS
mode       points  bounded  refused  broken  largest ||S(D) - S(D\\{s})|| / C
hooks          12       12        0       0  1.000000
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from dpnotebook.audit._cases import FAMILIES, RECORDS, audit_case
from dpnotebook.audit._sensitivity import FLOAT32_TOLERANCE, TOLERANCE, SensitivityReport, audit_sensitivity
from dpnotebook.modes import available_modes
from dpnotebook.privacy._arguments import check_choice

#: ``(loss_reduction, clipping)`` pairs audited: both reductions with flat clipping, per-layer with sum.
SETTINGS = (("mean", "flat"), ("sum", "flat"), ("sum", "per_layer"))

#: ``C`` for the grid: small enough that every record's samples are clipped.
C = 0.01


@dataclass(frozen=True)
class GridPoint:
    """One audited configuration."""

    mode: str
    family: str
    record: str
    K: int
    loss_reduction: str
    clipping: str
    batch_first: bool
    passes: int
    dtype: torch.dtype = torch.float64

    @property
    def name(self) -> str:
        layout = "batch_first" if self.batch_first else "time_major"
        return (
            f"{self.mode} {self.family}/{self.record} K={self.K} {self.loss_reduction} {self.clipping} "
            f"{layout} passes={self.passes} {str(self.dtype).replace('torch.', '')}"
        )


@dataclass
class Outcome:
    """What auditing a point gave: a report (``"bounded"`` or ``"violated"``) or an error (``"refused"``)."""

    point: GridPoint
    report: SensitivityReport | None = None
    error: BaseException | None = None

    @property
    def status(self) -> str:
        if self.error is not None:
            return "refused"
        return "bounded" if self.report is not None and self.report.ok() else "violated"


class Refusal(NamedTuple):
    """Points refused by design (``None``: any family, layout or number of passes), and the error expected."""

    modes: set[str]
    pattern: str
    why: str
    families: set[str] | None = None
    batch_first: bool | None = None
    passes: int | None = None
    types: tuple[type[BaseException], ...] = (Exception,)


#: The points the library refuses by design.
REFUSALS = [
    Refusal(
        {"ew"},
        r"rows",
        "the relative-position bias's rows are query positions: the provenance probe refuses it at B*K = T "
        "(the row count at B*K != T); hooks and ghost mode know the bias is batch-free and capture it where "
        "it meets the batch (grad_sample._engine.broadcast); functorch replays each sample whole",
        {"relative_bias"},
    ),
    Refusal(
        {"ew"},
        r"cannot handle batch_first=False",
        "ExpandedWeights needs the rows in dim 0",
        None,
        False,
        None,
        (ValueError,),
    ),
    Refusal({"ew"}, r"no per-sample rule", "ExpandedWeights has no rule for PReLU", {"fallback"}),
    Refusal(
        {"ew"},
        r"cannot be used with per-sample gradients",
        "DP layers share parameters between submodules, which ExpandedWeights cannot see",
        {"lstm", "attention"},
    ),
    Refusal(
        {"hooks", "ghost"},
        r"outside",
        "a parameter used outside its layer: its samplers would miss that part (functorch and ew follow it)",
        {"outside_use"},
    ),
    Refusal(
        {"hooks", "ghost", "ew"},
        r"rows",
        "layers see time steps in the batch dim, not samples (functorch replays each sample whole)",
        {"time_major"},
    ),
    Refusal(
        {"ew"},
        r"reached by two paths",
        "ExpandedWeights swaps parameters by path: a module reached by two paths has no rule",
        {"shared_parent"},
    ),
    Refusal(
        {"ew"},
        r"one backward pass went through 2 forward passes",
        "ExpandedWeights adds the per-row gradients of two forward passes row by row",
        passes=2,
    ),
    Refusal(
        {"hooks", "ghost"},
        r"rows",
        "a layer after the time-major part sees rows in dim 0 while batch_first=False says dim 1",
        {"last_step"},
        False,
    ),
]


def expected_refusal(point: GridPoint) -> Refusal | None:
    """The :class:`Refusal` that covers ``point``, or ``None`` if the library must audit it."""
    for r in REFUSALS:
        if (
            point.mode in r.modes
            and (r.families is None or point.family in r.families)
            and r.batch_first in (None, point.batch_first)
            and r.passes in (None, point.passes)
        ):
            return r
    return None


def grid(
    *,
    modes: Iterable[str] | None = None,
    families: Iterable[str] | None = None,
    records: Iterable[str] | None = None,
    Ks: Iterable[int] = (1, 3),
    dtype: torch.dtype = torch.float64,
) -> Iterator[GridPoint]:
    """Every point of the grid (a record only where it means something: cancelling copies need ``K > 1``).

    A family with ``same_size_neighbours`` is audited with ``loss_reduction="sum"`` only (with
    ``"mean"`` the definition divides each sample's loss by its own rows, the neighbour by all).
    An unknown mode, family or record is a ``ValueError`` listing the valid ones:

    >>> next(grid(families=["linear"]))
    Traceback (most recent call last):
    ...
    ValueError: family='linear' is unknown; choose one of ['attention', 'conv', ...].
    """
    modes = [check_choice("mode", m, available_modes()) for m in modes or available_modes()]
    families = [check_choice("family", f, FAMILIES) for f in families or FAMILIES]
    records = [check_choice("record", r, RECORDS) for r in records or RECORDS]
    for mode, family, record, K, (reduction, clipping) in itertools.product(modes, families, records, Ks, SETTINGS):
        fam = FAMILIES[family]
        if (
            (record == "cancelling_positions" and not fam.sequence)
            or (record == "cancelling_copies" and K == 1)
            or (reduction == "mean" and fam.same_size_neighbours)
        ):
            continue
        for batch_first, passes in itertools.product(fam.layouts, (1, 2)):
            yield GridPoint(mode, family, record, K, reduction, clipping, batch_first, passes, dtype)


def run_point(point: GridPoint, *, reference: bool = True) -> Outcome:
    """Audit ``point``; an error raised by the library is caught and kept in the outcome."""
    case = audit_case(point.family, point.record)
    K, batch_first = point.K, point.batch_first

    def batch(indices: list[int]) -> tuple[Tensor, ...]:
        xt = case.batch(indices, K=K, batch_first=batch_first)
        return tuple(a.to(point.dtype) if a.is_floating_point() else a for a in xt)

    try:
        report = audit_sensitivity(
            case.model(batch_first).to(point.dtype),
            batch=batch,
            num_samples=case.num_samples,
            mode=point.mode,
            K=K,
            loss=case.loss(loss_reduction=point.loss_reduction, batch_first=batch_first, K=K, passes=point.passes),
            loss_reduction=point.loss_reduction,
            batch_first=batch_first,
            clipping=point.clipping,
            max_grad_norm=C,
            reference=reference,
        )
    except Exception as error:  # noqa: BLE001 - a refusal is an outcome to check, not a crash
        return Outcome(point, error=error)
    return Outcome(point, report=report)


def matches(outcome: Outcome) -> str | None:
    """``None`` if the outcome is what the library promises for its point, else what went wrong.

    A kept point must stay within ``C * (1 + TOLERANCE)`` (float32: ``FLOAT32_TOLERANCE``) and within
    ``1e-6 C`` of the float64 definition (float32: ``1e-2 C``).
    """
    refusal, error, report = expected_refusal(outcome.point), outcome.error, outcome.report
    if error is not None:
        if refusal is None:
            return f"raised {type(error).__name__}: {error}"
        if not isinstance(error, refusal.types) or not re.search(refusal.pattern, str(error)):
            return f"refused with {type(error).__name__}: {error}; expected /{refusal.pattern}/"
        return None
    if refusal is not None:
        return f"was not refused (expected /{refusal.pattern}/: {refusal.why})\n{report}"
    assert report is not None  # an outcome holds an error or a report
    float64 = outcome.point.dtype == torch.float64
    if not report.ok(TOLERANCE if float64 else FLOAT32_TOLERANCE):
        return f"sensitivity over C:\n{report}"
    if report.reference_gap is not None and not report.reference_gap <= (1e-6 if float64 else 1e-2):
        return f"clipped sum differs from the float64 definition by {report.reference_gap:.3g} C:\n{report}"
    return None


def summarise(outcomes: Iterable[Outcome]) -> str:
    """One line per mode: points, bounded, refused (by design or not), broken (see :func:`matches`), worst ratio."""
    by_mode: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_mode[o.point.mode].append(o)
    lines = [f"{'mode':<9} {'points':>7}  bounded  refused  broken  largest ||S(D) - S(D\\{{s}})|| / C"]
    for mode, group in sorted(by_mode.items()):
        status = [o.status for o in group]
        broken = sum(matches(o) is not None for o in group)
        worst = max((o.report.max_ratio for o in group if o.report is not None), default=0.0)
        counts = f"{len(group):>7} {status.count('bounded'):>8} {status.count('refused'):>8} {broken:>7}"
        lines.append(f"{mode:<9} {counts}  {worst:.6f}")
    return "\n".join(lines)
