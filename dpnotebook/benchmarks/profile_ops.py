"""Operations per DP step: a proxy for GPU kernel launches that the CPU can measure.

:func:`count_ops` profiles one step (after a warm-up) and counts its kernels: the innermost aten ops that
do work, leaving out those that launch nothing on a GPU (:data:`NO_KERNEL`) and two CPU artefacts; a
``torch._foreach_*`` op counts once (one multi-tensor kernel on a GPU). A tiny kernel weighs as much as a
large matmul (``docs/performance.md``). It also counts the step's host reads (:data:`HOST_READS`: a value
read back to Python, where a GPU makes the host wait for every kernel queued before it).
``python -m dpnotebook.benchmarks --profile-ops`` prints the counts.

>>> from dpnotebook.benchmarks.steps import make_step
>>> count = count_ops(make_step("MLP", "dpsgd_hooks", batch=4))
>>> count.total > 0, count.top(1)[0][0].startswith("aten::"), count.host_reads
(True, True, 1)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

__all__ = ["HOST_READS", "NO_KERNEL", "OpCount", "count_ops", "profile_table", "PROFILE_BATCH"]

#: Samples per batch of ``--profile-ops``: counts hardly depend on it (no mode loops over samples).
PROFILE_BATCH = 16

#: Leaf aten ops that launch no kernel on a GPU: views, metadata, allocation without a fill.
NO_KERNEL = frozenset(
    f"aten::{name}"
    for name in (
        "view _unsafe_view reshape alias as_strided t transpose permute expand expand_as select slice "
        "unsqueeze squeeze narrow unflatten flatten movedim unbind split split_with_sizes chunk diagonal "
        "detach detach_ lift_fresh empty empty_like empty_strided new_empty new_empty_strided resize_ set_ is_nonzero "
        "item _local_scalar_dense size stride numel dim is_same_size result_type _has_compatible_shallow_copy_type "
        "_reshape_alias view_as squeeze_ unsqueeze_ t_ transpose_ as_strided_ _nested_tensor_from_mask_left_aligned "
        "requires_grad_ record_stream to resolve_conj resolve_neg contiguous conj _conj"
    ).split()
)


#: Tensor methods that read values back to the host: on a GPU each one waits for the queued kernels.
HOST_READS = frozenset("item tolist numpy cpu __bool__ __float__ __int__ __index__".split())


class _HostReads(TorchFunctionMode):
    """Counts the calls of :data:`HOST_READS` methods while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += getattr(func, "__name__", "") in HOST_READS
        return func(*args, **(kwargs or {}))


@dataclass
class OpCount:
    """The leaf aten operations of one step, by name (:data:`NO_KERNEL` left out), and its host reads."""

    ops: Counter[str] = field(default_factory=Counter)
    host_reads: int = 0

    @property
    def total(self) -> int:
        """All counted operations of the step."""
        return sum(self.ops.values())

    def top(self, n: int = 10) -> list[tuple[str, int]]:
        """The ``n`` most frequent operations."""
        return self.ops.most_common(n)


def count_ops(step: Callable[[], None], *, warmup: int = 1) -> OpCount:
    """Count the leaf aten operations and host reads of one call of ``step`` (after ``warmup`` calls), on the CPU."""
    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, _HostReads() as reads:
        step()
    counted: Counter[str] = Counter()
    for event in prof.events():
        if event.name.startswith("aten::") and not _has_aten_ancestor(event):
            counted.update(_kernels(event))
    return OpCount(counted, reads.count)


def _has_aten_ancestor(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def _kernels(event: Any) -> Counter[str]:
    """The kernels of one aten op: its aten children's if they launch any, else itself (if it launches one)."""
    name = event.name
    if name.startswith("aten::_foreach_"):  # one multi-tensor kernel on a GPU; a loop on the CPU
        return Counter({name: 1})
    inner: Counter[str] = Counter()
    for child in event.cpu_children:
        if child.name.startswith("aten::"):
            inner.update(_kernels(child))
    if inner:
        return inner
    parent = event.cpu_parent.name if event.cpu_parent is not None else ""
    if name in NO_KERNEL or _cpu_artefact(name, parent, event.input_shapes):
        return Counter()
    return Counter({name: 1})


#: Reductions whose CPU kernels fill their output before accumulating (one kernel on a GPU).
_REDUCTIONS = frozenset(
    f"aten::{n}" for n in "sum mean all any amax amin prod norm linalg_vector_norm max min logsumexp".split()
)


def _cpu_artefact(name: str, parent: str, shapes: list[Any]) -> bool:
    """A leaf op a GPU would not launch: a Python scalar copied into a 0-dim tensor, or a CPU reduction's first fill.

    >>> _cpu_artefact("aten::copy_", "aten::_to_copy", [[], [], []]), _cpu_artefact("aten::fill_", "aten::sum", [[4]])
    (True, True)
    >>> _cpu_artefact("aten::copy_", "aten::addmm", [[16, 10], [16, 10], []])
    False
    """
    if name in ("aten::copy_", "aten::fill_", "aten::_to_copy") and shapes and shapes[0] == []:
        return True
    return name == "aten::fill_" and parent in _REDUCTIONS


def _count(model: str, what: str, batch: int) -> OpCount | str:
    from dpnotebook.benchmarks.steps import make_step

    try:
        return count_ops(make_step(model, what, batch=batch))
    except Exception as err:  # noqa: BLE001 - a mode that cannot run a model is a cell of the table
        return f"{type(err).__name__}"


def profile_table(models: list[str], modes: list[str], *, batch: int = PROFILE_BATCH, opacus: bool = True) -> str:
    """A markdown table of kernels per DP step, host reads in brackets: ``dpnotebook / Opacus 1.6`` in each mode
    (``-`` without Opacus, the exception's name where a step cannot run), then the best modes (kernels)."""
    from dpnotebook.benchmarks.steps import OPACUS_MODES, opacus_available

    opacus = opacus and opacus_available() is not None
    head = "| model | non-private | " + " | ".join(f"{m} (dpn / Opacus)" for m in modes) + " | best (dpn / Opacus) |"
    lines = [head, "|" + "---|" * (len(modes) + 3)]
    for model in models:
        plain = _count(model, "nonprivate", batch)
        cells, ours, theirs = [], [], []
        for mode in modes:
            a = _count(model, f"dpsgd_{mode}", batch)
            b = _count(model, f"opacus_dpsgd_{mode}", batch) if opacus and mode in OPACUS_MODES else "-"
            ours += [a.total] if isinstance(a, OpCount) else []
            theirs += [b.total] if isinstance(b, OpCount) else []
            cells.append(f"{_cell(a)} / {_cell(b)}")
        best = f"{min(ours) if ours else '-'} / {min(theirs) if theirs else '-'}"
        lines.append(f"| {model} | {_cell(plain)} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def _cell(count: OpCount | str) -> str:
    return f"{count.total} ({count.host_reads})" if isinstance(count, OpCount) else count
