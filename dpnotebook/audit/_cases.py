"""What the sensitivity auditor is run on: layer families, adversarial records, the grid, training-loop surfaces.

*Layer families* (:data:`FAMILIES`) are small seeded models, each a way a per-sample gradient is
formed or a model put together that has broken DP libraries before; a sequence family's sample is
``[T, ...]`` and time-major (``batch_first=False``) puts rows in dim 1. *Records* (:data:`RECORDS`)
are the adversarial data patterns; an :class:`AuditCase` is a family with a record. :func:`grid` lists
every mode x family x record x K x reduction x layout x clipping, :func:`run_point` audits one, and
:data:`REFUSALS` are the points the library refuses by design (:func:`matches`, :func:`summarise`).
*Surfaces* (:data:`SURFACES`) are ways of driving the optimizer in a training loop (:func:`audit_surface`).
docs/guarantees.md ("How it is checked") lists them all and what each found.

>>> case = audit_case("mlp", "scale_1e4")
>>> x, t = case.batch([0, 2], K=2, batch_first=True)
>>> tuple(x.shape), tuple(t.shape)
((4, 6), (4, 3))
>>> x, t = FAMILIES["embedding"].data(3, 2, torch.Generator().manual_seed(0))
>>> tuple(x.shape), x.dtype, tuple(t.shape)
((3, 2, 5), torch.int64, (3, 2, 5, 3))
>>> report = audit_surface("freeze_after_backward", "hooks")
Traceback (most recent call last):
...
RuntimeError: DP step refused: parameter '0.weight' has requires_grad=False but holds a .grad ...
>>> surface_matches("freeze_after_backward", "ghost") is None   # ghost keeps the bound (no raw .grad)
True
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
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.audit._sensitivity import FLOAT32_TOLERANCE, TOLERANCE, SensitivityReport, audit_sensitivity
from dpnotebook.grad_sample._engine.precision import matmul_precision
from dpnotebook.layers import DPLSTM, DPMultiheadAttention
from dpnotebook.modes import available_modes
from dpnotebook.privacy._arguments import check_choice

T = 5  # positions of a sequence sample
#: The clipping bound of the grid and the surfaces: small enough that every sample is clipped.
C = 0.01


@dataclass(frozen=True)
class Family:
    """A model maker (``make(batch_first)``) and the shapes of one row's input and output.

    Attributes:
        sequence: rows may be in dim 1 (``batch_first=False``) as well.
        vocab: inputs are token ids from ``range(vocab)`` (``0``: float inputs).
        out_batch_first: the output keeps rows in dim 0 in either layout.
        same_size_neighbours: a neighbour keeps every sample and zeroes the removed one's targets.
    """

    name: str
    make: Callable[[bool], nn.Module]
    sample: tuple[int, ...]
    out: tuple[int, ...]
    sequence: bool = False
    vocab: int = 0
    out_batch_first: bool = False
    same_size_neighbours: bool = False

    @property
    def layouts(self) -> tuple[bool, ...]:
        """The ``batch_first`` values the family is audited in."""
        return (True, False) if self.sequence else (True,)

    def data(self, n: int, K: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """Friendly data: ``[n, K, *sample]`` inputs and ``[n, K, *out]`` targets (copies differ slightly)."""
        if self.vocab:
            x = torch.randint(1, self.vocab, (n, 1, *self.sample), generator=gen).expand(n, K, *self.sample).clone()
        else:
            base = torch.randn(n, 1, *self.sample, generator=gen)
            x = base + 0.1 * torch.randn(n, K, *self.sample, generator=gen)  # K augmented copies
        return x, torch.randn(n, K, *self.out, generator=gen)


class _LSTMHead(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.lstm = DPLSTM(6, 5, batch_first=batch_first)
        self.out = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.lstm(x)[0])


class _SelfAttention(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attn = DPMultiheadAttention(8, 2, batch_first=batch_first)
        self.out = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.attn(x, x, x, need_weights=False)[0])


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 11)
        self.out.weight = self.emb.weight  # tied: one Parameter, two layers

    def forward(self, idx: Tensor) -> Tensor:
        return self.out(torch.tanh(self.emb(idx)))


class _SharedParent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(6, 6)
        self.a = nn.Sequential(shared, nn.Tanh())  # one module, two parents
        self.b = nn.Sequential(shared, nn.Tanh())
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.b(self.a(x)))


class _OutsideUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.fc(x))
        return self.head(F.linear(h, self.fc.weight))  # fc.weight used again, outside fc


class _TimeMajorInside(nn.Module):
    """Takes ``[B, T]`` ids and runs time-major inside (``emb(idx.t())``): every layer sees ``T`` rows in dim 0."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, idx: Tensor) -> Tensor:
        h = torch.tanh(self.emb(idx.t()))  # [T, B, 6]
        return self.out(h).transpose(0, 1)  # back to [B, T, 3]


class _LastStep(nn.Module):
    """A sequence in either layout in, one output per sample (``[B, classes]``, batch-first) out."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.proj = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.proj(x))
        return self.head(h[:, -1] if self.batch_first else h[-1])


class RelativeBias(nn.Module):
    """T5-style self-attention: a relative-position bias table looked up with a ``[T, T]`` bucket matrix.

    The bias ``[H, T, T]`` is computed once and broadcast over the batch, as in Hugging Face T5: its
    rows are the ``T`` query positions, which no count tells from the batch's rows when ``T = B*K``.

    >>> RelativeBias()(torch.randint(0, 11, (3, 4))).shape
    torch.Size([3, 4, 3])
    """

    def __init__(self, vocab: int = 11, d: int = 8, heads: int = 2, buckets: int = 7, classes: int = 3) -> None:
        super().__init__()
        self.heads, self.buckets = heads, buckets
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.rel = nn.Embedding(buckets, heads)
        self.out = nn.Linear(d, classes)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        q, k, v = self.qkv(self.emb(idx)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        pos = torch.arange(T, device=idx.device)
        half = self.buckets // 2
        buckets = (pos[None, :] - pos[:, None]).clamp(-half, half) + half  # [T, T] relative distances
        bias = self.rel(buckets).permute(2, 0, 1)  # [H, T, T], shared by the batch
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


def _conv(batch_first: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("mlp", lambda bf: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), (6,), (3,)),
        Family("conv", _conv, (1, 6, 6), (3,)),
        Family("norms", lambda bf: nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 3)), (6,), (3,)),
        Family("fallback", lambda bf: nn.Sequential(nn.Linear(6, 8), nn.PReLU(8), nn.Linear(8, 3)), (6,), (3,)),
        Family("seq_linear", lambda bf: nn.Linear(64, 64, bias=False), (T, 64), (T, 64), sequence=True),
        Family(
            "embedding",
            lambda bf: nn.Sequential(nn.Embedding(11, 6, padding_idx=0), nn.Linear(6, 3)),
            (T,),
            (T, 3),
            sequence=True,
            vocab=11,
        ),
        Family("lstm", _LSTMHead, (T, 6), (T, 3), sequence=True),
        Family("attention", _SelfAttention, (T, 8), (T, 3), sequence=True),
        Family("tied", lambda bf: _Tied(), (T,), (T, 11), sequence=True, vocab=11),
        Family("shared_parent", lambda bf: _SharedParent(), (6,), (3,)),
        Family("outside_use", lambda bf: _OutsideUse(), (6,), (3,)),
        Family("time_major", lambda bf: _TimeMajorInside(), (T,), (T, 3), vocab=11),
        Family("last_step", _LastStep, (T, 6), (3,), sequence=True, out_batch_first=True),
        # T = 4 = the audit's samples: at K = 1 the batch's rows equal the query positions
        Family("relative_bias", lambda bf: RelativeBias(), (4,), (4, 3), vocab=11, same_size_neighbours=True),
    ]
}

RECORDS = ("gaussian", "scale_1e4", "zero_loss", "duplicated", "cancelling_copies", "cancelling_positions")

#: Samples in every audited batch.
NUM_SAMPLES = 4
#: The most augmented copies a case prepares data for.
MAX_K = 4


def _apply_record(record: str, family: Family, x: Tensor, t: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Turn friendly data ``x`` ``[N, MAX_K, ...]`` and targets ``t`` into ``record``'s pattern."""
    x, t = x.clone(), t.clone()
    if record == "scale_1e4":  # one sample's inputs, or for token ids its targets
        (x if x.is_floating_point() else t)[1] *= 1e4
    elif record == "zero_loss":
        t[[0, 2]] = 0
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
        t[0, :, :2] *= 1000
    else:
        check_choice("record", record, RECORDS)
    return x, t


def _rows(data: Tensor, indices: list[int], K: int, batch_first: bool) -> Tensor:
    """The ``K`` copies of each sample in ``indices``, sample-major; rows in dim 1 unless ``batch_first``."""
    picked = data[indices, :K]  # [n, K, ...]
    rows = picked.reshape(len(indices) * K, *picked.shape[2:])
    return rows if batch_first else rows.transpose(0, 1)


@dataclass
class AuditCase:
    """One layer family with one record (of :data:`RECORDS`): ``[N, MAX_K, ...]`` inputs and targets."""

    family: Family
    record: str
    inputs: Tensor
    targets: Tensor

    @property
    def num_samples(self) -> int:
        return self.inputs.shape[0]

    def model(self, batch_first: bool) -> nn.Module:
        """The family's model, seeded (the same weights on every call)."""
        torch.manual_seed(0)
        return self.family.make(batch_first)

    def batch(self, indices: list[int], *, K: int, batch_first: bool) -> tuple[Tensor, Tensor]:
        """``(inputs, targets)`` of the samples in ``indices``: ``K`` rows each, sample-major.

        A family with ``same_size_neighbours`` keeps every sample and zeroes the others' targets.
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
        """``loss(model, (x, t))``: ``<output, target>`` over ``passes`` (1 or 2) forward passes before one backward.

        Two passes cut the batch between samples; each pass's loss is reduced over its own rows.
        """
        bd, sum_ = (0 if batch_first else 1), loss_reduction == "sum"
        td = 0 if batch_first or self.family.out_batch_first else 1

        def run(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
            x, t = batch
            rows = x.shape[bd]
            cut = (rows // K // 2) * K if passes == 2 else rows
            ends = [0, cut, rows] if 0 < cut < rows else [0, rows]
            parts = [
                (model(x.narrow(bd, a, b - a)) * t.narrow(td, a, b - a)).sum() / (1 if sum_ else max(b - a, 1))
                for a, b in itertools.pairwise(ends)
            ]
            return sum(parts[1:], parts[0])

        return run


def audit_case(family: str, record: str, *, num_samples: int = NUM_SAMPLES, seed: int = 0) -> AuditCase:
    """The seeded :class:`AuditCase` of ``family`` (a key of ``FAMILIES``) with ``record``."""
    fam = FAMILIES[check_choice("family", family, FAMILIES)]
    gen = torch.Generator().manual_seed(seed)
    x, t = fam.data(num_samples, MAX_K, gen)
    x, t = _apply_record(record, fam, x, t, gen)
    return AuditCase(fam, record, x, t)


#: ``(loss_reduction, clipping)`` pairs audited: both reductions with flat clipping, per-layer with sum.
SETTINGS = (("mean", "flat"), ("sum", "flat"), ("sum", "per_layer"))


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
    matmul: str = "highest"  # float32 products as torch.set_float32_matmul_precision sets them

    @property
    def name(self) -> str:
        layout = "batch_first" if self.batch_first else "time_major"
        products = "" if self.matmul == "highest" else f" matmul={self.matmul}"
        return (
            f"{self.mode} {self.family}/{self.record} K={self.K} {self.loss_reduction} {self.clipping} "
            f"{layout} passes={self.passes} {str(self.dtype).replace('torch.', '')}{products}"
        )

    @property
    def rounded(self) -> bool:
        """Whether the point's float32 matrix products may round (to TF32 or bfloat16)."""
        return self.matmul != "highest" and self.dtype == torch.float32

    @property
    def tolerance(self) -> float:
        """The slack above ``C`` allowed at this point: ``TOLERANCE`` in float64, ``FLOAT32_TOLERANCE`` otherwise."""
        return TOLERANCE if self.dtype == torch.float64 else FLOAT32_TOLERANCE


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
        return "bounded" if self.report is not None and self.report.ok(self.point.tolerance) else "violated"


class Refusal(NamedTuple):
    """Points refused by design (``None``: any family, layout or number of passes), and the error expected."""

    modes: set[str]
    pattern: str
    why: str
    families: set[str] | None = None
    batch_first: bool | None = None
    passes: int | None = None
    types: tuple[type[BaseException], ...] = (Exception,)
    rounded: bool | None = None


#: The points the library refuses by design (docs/guarantees.md says why).
REFUSALS = [
    Refusal(
        {"ew"},
        r"products may round",
        "ExpandedWeights' gradients round",
        set(FAMILIES) - {"shared_parent", "lstm", "attention"},
        True,
        rounded=True,
    ),  # first: raised in the forward pass, before the others (not those made at wrapping, kept out)
    Refusal({"ew"}, r"rows", "the bias's rows are query positions (hooks, ghost: captured)", {"relative_bias"}),
    Refusal({"ew"}, r"cannot handle batch_first=False", "rows must be in dim 0", None, False, None, (ValueError,)),
    Refusal({"ew"}, r"no per-sample rule", "ExpandedWeights has no rule for PReLU", {"fallback"}),
    Refusal({"ew"}, r"cannot be used with per-sample gradients", "DP layers share parameters", {"lstm", "attention"}),
    Refusal({"hooks", "ghost"}, r"outside", "a parameter used outside its layer", {"outside_use"}),
    Refusal({"hooks", "ghost", "ew"}, r"rows", "layers see time steps as rows", {"time_major"}),
    Refusal({"ew"}, r"reached by two paths", "ExpandedWeights swaps parameters by path", {"shared_parent"}),
    Refusal({"ew"}, r"one backward pass went through 2 forward passes", "rows of two passes add up", passes=2),
    Refusal({"hooks", "ghost"}, r"rows", "rows in dim 0 after a time-major part", {"last_step"}, False),
]


def expected_refusal(point: GridPoint) -> Refusal | None:
    """The :class:`Refusal` that covers ``point``, or ``None`` if the library must audit it."""
    for r in REFUSALS:
        if (
            point.mode in r.modes
            and (r.families is None or point.family in r.families)
            and r.batch_first in (None, point.batch_first)
            and r.passes in (None, point.passes)
            and r.rounded in (None, point.rounded)
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
    matmul: str = "highest",
) -> Iterator[GridPoint]:
    """Every point of the grid (a record only where it means something; ``same_size_neighbours``: sum only).

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
            yield GridPoint(mode, family, record, K, reduction, clipping, batch_first, passes, dtype, matmul)


def run_point(point: GridPoint, *, reference: bool = True, compile_backend: str | None = None) -> Outcome:
    """Audit ``point``; an error raised by the library is caught and kept in the outcome.

    With ``compile_backend`` (e.g. ``"inductor"``), the model is first compiled afresh with
    ``torch.compile(model, backend=compile_backend)``, as a user who compiles before training would.
    """
    case = audit_case(point.family, point.record)
    model = case.model(point.batch_first).to(point.dtype)
    if compile_backend is not None:
        check_choice("compile_backend", compile_backend, torch.compiler.list_backends(exclude_tags=()))
        torch.compiler.reset()  # a fresh cache: each point compiles its own graphs
        model = cast(nn.Module, torch.compile(model, backend=compile_backend))
    K, batch_first = point.K, point.batch_first

    def batch(indices: list[int]) -> tuple[Tensor, ...]:
        xt = case.batch(indices, K=K, batch_first=batch_first)
        return tuple(a.to(point.dtype) if a.is_floating_point() else a for a in xt)

    try:
        with matmul_precision(point.matmul):
            report = audit_sensitivity(
                model,
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
    if not report.ok(outcome.point.tolerance):
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


#: The samples of the audited batch; sample 0 is the adversarial one (inputs x 100: a gradient far above C).
B = 4


@dataclass(frozen=True)
class Surface:
    """One way of driving a DP step (``description``), and the ``(error type, pattern)`` of its refusal.

    ``step(mode, x, weights)`` runs one step and returns the flat parameter update and the ``C`` of its noise.
    """

    name: str
    description: str
    step: Callable[[str, Tensor, Tensor], tuple[Tensor, float]]
    refusal: tuple[type[BaseException], str]


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _data() -> Tensor:
    x = torch.randn(B, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0] *= 100.0
    return x


def _loss(model: nn.Module, x: Tensor, weights: Tensor) -> Tensor:
    """Each sample's loss times its weight, summed (``loss_reduction="sum"``)."""
    return (weights * model(x).pow(2).sum(-1)).sum()


def _flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _engine_step_setup(
    mode: str, model: nn.Module, params: list[nn.Parameter], x: Tensor, weights: Tensor
) -> tuple[nn.Module, Any, DataLoader[Any]]:
    """``make_private`` over ``params`` with the whole batch as one fixed batch (σ = 0, sum, lr = 1)."""
    from dpnotebook.privacy import PrivacyEngine

    loader = DataLoader(TensorDataset(x, weights), batch_size=B)
    engine = PrivacyEngine(secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # poisson_sampling=False: the batch is fixed on purpose
        made = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(params, lr=1.0),
            data_loader=loader,
            noise_multiplier=0.0,
            max_grad_norm=C,
            grad_sample_mode=mode,
            loss_reduction="sum",
            poisson_sampling=False,
        )
    assert len(made) == 3  # no criterion given: (module, optimizer, data_loader)
    return made


def freeze_after_backward(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``backward()``, then ``model[0].weight.requires_grad_(False)``, then ``step()``."""
    model = _model()
    wrapped, optimizer, _ = _engine_step_setup(mode, model, list(model.parameters()), x, weights)
    before = _flat(model)
    optimizer.zero_grad()
    _loss(wrapped, x, weights).backward()
    model[0].weight.requires_grad_(False)
    optimizer.step()
    return _flat(model) - before, C


def two_make_private(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``make_private`` twice on one model (one optimizer per half of the parameters), both stepped."""
    model = _model()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    wrapped, opt1, _ = _engine_step_setup(mode, model, first, x, weights)
    wrapped, opt2, _ = _engine_step_setup(mode, wrapped, second, x, weights)
    before = _flat(model)
    opt1.zero_grad()
    opt2.zero_grad()
    _loss(wrapped, x, weights).backward()
    opt1.step()
    opt2.step()
    return _flat(model) - before, C


def clip_scheduler_in_batch_memory(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``ExponentialGradClip(gamma=0.5)`` stepped after every physical step of ``BatchMemoryManager``."""
    from dpnotebook.privacy import BatchMemoryManager, ExponentialGradClip

    model = _model()
    wrapped, optimizer, loader = _engine_step_setup(mode, model, list(model.parameters()), x, weights)
    scheduler = ExponentialGradClip(optimizer, gamma=0.5)
    noise_bounds: list[float] = []
    optimizer.attach_step_hook(lambda opt: noise_bounds.append(opt.max_grad_norm))
    before = _flat(model)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=1, optimizer=optimizer) as batches:
        for xb, wb in batches:
            optimizer.zero_grad()
            _loss(wrapped, xb, wb).backward()
            optimizer.step()
            scheduler.step()
    return _flat(model) - before, noise_bounds[-1]


#: The surfaces, by name.
SURFACES: dict[str, Surface] = {
    s.name: s
    for s in (
        Surface(
            "freeze_after_backward",
            "a parameter frozen between backward() and step(): its raw .grad must not be applied",
            freeze_after_backward,
            (RuntimeError, r"requires_grad=False but holds a \.grad"),
        ),
        Surface(
            "two_make_private",
            "make_private twice on one model, one optimizer per half of the parameters, both stepped",
            two_make_private,
            (RuntimeError, r"already has a DP optimizer"),
        ),
        Surface(
            "clip_scheduler_in_batch_memory",
            "a clipping scheduler stepped after each physical step of BatchMemoryManager",
            clip_scheduler_in_batch_memory,
            (RuntimeError, r"changed while a logical batch is accumulated"),
        ),
    )
}


def audit_surface(name: str, mode: str) -> SensitivityReport:
    """``||update(D) - update(D')|| / C`` of surface ``name`` in ``mode`` for every sample (``D'``: its weight 0).

    Returns a :class:`~dpnotebook.audit.SensitivityReport`; a refusal of the library propagates.

    Raises:
        KeyError: ``name`` is not a key of :data:`SURFACES` (the message lists them).
    """
    if name not in SURFACES:
        raise KeyError(f"surface {name!r} is unknown; choose one of {sorted(SURFACES)}.")
    surface = SURFACES[name]
    x = _data()
    full, bound = surface.step(mode, x, torch.ones(B, dtype=torch.float64))
    report = SensitivityReport({"surface": name, "mode": mode, "C": bound})
    for s in range(B):
        weights = torch.ones(B, dtype=torch.float64)
        weights[s] = 0.0
        update, _ = surface.step(mode, x, weights)
        report.ratios.append(float((full - update).norm()) / bound)
        report.movers.append("all parameters")
    return report


def surface_matches(name: str, mode: str) -> str | None:
    """``None`` if surface ``name`` is refused with its documented error or keeps the bound in ``mode``, else why."""
    types, pattern = SURFACES[name].refusal
    try:
        report = audit_surface(name, mode)
    except types as error:
        return None if re.search(pattern, str(error)) else f"refused with {error!r}; expected /{pattern}/"
    except Exception as error:  # noqa: BLE001 - any other error is a finding to report, not a crash
        return f"raised {type(error).__name__}: {error}"
    return None if report.ok() else f"sensitivity over C:\n{report}"
