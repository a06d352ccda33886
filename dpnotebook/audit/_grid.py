"""The adversarial grid: every mode x layer family x record x K x reduction x layout x clipping.

:func:`grid` lists the points, :func:`run_point` audits one with :func:`~dpnotebook.audit.audit_sensitivity`,
and :data:`REFUSALS` says which points the library refuses by design, with the error it must raise.
Every other point must keep the bound (``<= C * (1 + 1e-5)`` in float64, ``1e-4`` in float32:
:data:`~dpnotebook.audit.FLOAT32_TOLERANCE`) and match the float64 definition (:func:`matches`);
:func:`summarise` counts the outcomes per mode. ``python -m dpnotebook.audit`` runs the whole grid.
How a training loop drives the step is audited per mode by :func:`~dpnotebook.audit.surface_matches`.

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

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from dpnotebook.audit._cases import FAMILIES, RECORDS, audit_case
from dpnotebook.audit._sensitivity import FLOAT32_TOLERANCE, TOLERANCE, SensitivityReport, audit_sensitivity
from dpnotebook.modes import available_modes
from dpnotebook.privacy._arguments import check_choice

Refusal = tuple[str | set[str], set[str] | None, bool | None, int | None, tuple[type[BaseException], ...], str, str]


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
        dtype = str(self.dtype).replace("torch.", "")
        return (
            f"{self.mode} {self.family}/{self.record} K={self.K} {self.loss_reduction} {self.clipping} "
            f"{layout} passes={self.passes} {dtype}"
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


#: ``(a mode or a set of modes, families or None for all, layout or None for both, passes or None,
#: error types, message pattern, why)``.
REFUSALS: list[Refusal] = [
    (
        "ew",
        {"relative_bias"},
        None,
        None,
        (Exception,),
        r"rows",
        "the relative-position bias's rows are query positions: the provenance probe refuses it at B*K = T "
        "(the row count at B*K != T); hooks and ghost mode know the bias is batch-free and capture it where "
        "it meets the batch (grad_sample._engine.broadcast); functorch replays each sample whole",
    ),
    (
        "ew",
        None,
        False,
        None,
        (ValueError,),
        r"cannot handle batch_first=False",
        "ExpandedWeights needs the rows in dim 0",
    ),
    ("ew", {"fallback"}, None, None, (Exception,), r"no per-sample rule", "ExpandedWeights has no rule for PReLU"),
    (
        "ew",
        {"lstm", "attention"},
        None,
        None,
        (Exception,),
        r"cannot be used with per-sample gradients",
        "DP layers share parameters between submodules, which ExpandedWeights cannot see",
    ),
    (
        {"hooks", "ghost"},
        {"outside_use"},
        None,
        None,
        (Exception,),
        r"outside",
        "a parameter used outside its layer: its samplers would miss that part (functorch and ew follow it)",
    ),
    (
        {"hooks", "ghost", "ew"},
        {"time_major"},
        None,
        None,
        (Exception,),
        r"rows",
        "layers see time steps in the batch dim, not samples (functorch replays each sample whole)",
    ),
    (
        "ew",
        {"shared_parent"},
        None,
        None,
        (Exception,),
        r"reached by two paths",
        "ExpandedWeights swaps parameters by path: a module reached by two paths has no rule",
    ),
    (
        "ew",
        None,
        None,
        2,
        (Exception,),
        r"one backward pass went through 2 forward passes",
        "ExpandedWeights adds the per-row gradients of two forward passes row by row",
    ),
    (
        {"hooks", "ghost"},
        {"last_step"},
        False,
        None,
        (Exception,),
        r"rows",
        "a layer after the time-major part sees rows in dim 0 while batch_first=False says dim 1",
    ),
]


def expected_refusal(point: GridPoint) -> tuple[tuple[type, ...], str, str] | None:
    """``(error types, message pattern, why)`` if the library refuses ``point`` by design, else ``None``."""
    for mode, families, layout, passes, types, pattern, why in REFUSALS:
        modes = {mode} if isinstance(mode, str) else mode
        if (
            (modes is None or point.mode in modes)
            and (families is None or point.family in families)
            and layout in (None, point.batch_first)
            and passes in (None, point.passes)
        ):
            return types, pattern, why
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

    A family audited with neighbours that keep the batch size (``same_size_neighbours``) is
    audited with ``loss_reduction="sum"`` only: with ``"mean"`` the neighbour's loss is still
    divided by every row, while the float64 definition divides each sample's by its own rows.

    A name that is not a registered mode, a family of :data:`~dpnotebook.audit.FAMILIES`
    or a record of :data:`~dpnotebook.audit.RECORDS` is a ``ValueError`` listing the
    valid ones (not a grid of points that all fail):

    >>> next(grid(families=["linear"]))
    Traceback (most recent call last):
    ...
    ValueError: family='linear' is unknown; choose one of ['attention', 'conv', ...].
    """
    modes = [check_choice("mode", m, available_modes()) for m in modes or available_modes()]
    families = [check_choice("family", f, FAMILIES) for f in families or FAMILIES]
    records = [check_choice("record", r, RECORDS) for r in records or RECORDS]
    for mode in modes:
        for family in families:
            fam = FAMILIES[family]
            for record in records:
                if record == "cancelling_positions" and not fam.sequence:
                    continue
                for K in Ks:
                    if record == "cancelling_copies" and K == 1:
                        continue
                    for loss_reduction, clipping in SETTINGS:
                        if loss_reduction == "mean" and fam.same_size_neighbours:
                            continue  # the definition takes each sample alone: its mean is over its own rows
                        for batch_first in fam.layouts:
                            for passes in (1, 2):
                                yield GridPoint(
                                    mode, family, record, K, loss_reduction, clipping, batch_first, passes, dtype
                                )


def run_point(point: GridPoint, *, reference: bool = True) -> Outcome:
    """Audit ``point``; an error raised by the library is caught and kept in the outcome."""
    case = audit_case(point.family, point.record)
    model = case.model(point.batch_first).to(point.dtype)

    def batch(indices: list[int]) -> tuple[Tensor, ...]:
        x, t = case.batch(indices, K=point.K, batch_first=point.batch_first)
        return tuple(a.to(point.dtype) if a.is_floating_point() else a for a in (x, t))

    try:
        report = audit_sensitivity(
            model,
            batch=batch,
            num_samples=case.num_samples,
            mode=point.mode,
            K=point.K,
            loss=case.loss(
                loss_reduction=point.loss_reduction, batch_first=point.batch_first, K=point.K, passes=point.passes
            ),
            loss_reduction=point.loss_reduction,
            batch_first=point.batch_first,
            clipping=point.clipping,
            max_grad_norm=C,
            reference=reference,
        )
    except Exception as error:  # noqa: BLE001 - a refusal is an outcome to check, not a crash
        return Outcome(point, error=error)
    return Outcome(point, report=report)


def matches(outcome: Outcome) -> str | None:
    """``None`` if the outcome is what the library promises for its point, else what went wrong."""
    refusal = expected_refusal(outcome.point)
    if outcome.error is not None:
        if refusal is None:
            return f"raised {type(outcome.error).__name__}: {outcome.error}"
        types, pattern, _ = refusal
        if not isinstance(outcome.error, types) or not re.search(pattern, str(outcome.error)):
            return f"refused with {type(outcome.error).__name__}: {outcome.error}; expected /{pattern}/"
        return None
    if refusal is not None:
        return f"was not refused (expected /{refusal[1]}/: {refusal[2]})\n{outcome.report}"
    report = outcome.report
    assert report is not None  # an outcome holds an error or a report
    float64 = outcome.point.dtype == torch.float64
    if not report.ok(TOLERANCE if float64 else FLOAT32_TOLERANCE):
        return f"sensitivity over C:\n{report}"
    tolerance = 1e-6 if outcome.point.dtype == torch.float64 else 1e-2
    if report.reference_gap is not None and not report.reference_gap <= tolerance:
        return f"clipped sum differs from the float64 definition by {report.reference_gap:.3g} C:\n{report}"
    return None


def summarise(outcomes: Iterable[Outcome]) -> str:
    """One line per mode: points, bounded, refused (by design or not), broken (see :func:`matches`), worst ratio."""
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for o in outcomes:
        row = rows[o.point.mode]
        row[0] += 1
        row[1] += o.status == "bounded"
        row[2] += o.status == "refused"
        row[3] += matches(o) is not None
        if o.report is not None:
            row[4] = max(row[4], o.report.max_ratio)
    lines = [f"{'mode':<9} {'points':>7}  bounded  refused  broken  largest ||S(D) - S(D\\{{s}})|| / C"]
    for mode, (n, bounded, refused, broken, worst) in sorted(rows.items()):
        lines.append(f"{mode:<9} {n:>7.0f} {bounded:>8.0f} {refused:>8.0f} {broken:>7.0f}  {worst:.6f}")
    return "\n".join(lines)
