"""The obviously correct oracle, and a checker for grad samplers (yours included).

:func:`reference_grad_samples` computes per-sample gradients the slow way: one backward pass per
row, in float64, then the mean over each sample's ``K`` rows. Everything else is tested against it.

>>> import torch
>>> from torch import nn
>>> from dpnotebook.testing import check_grad_sampler
>>> report = check_grad_sampler(nn.Linear(3, 2), torch.randn(6, 3), K=2)
>>> report.ok
True
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSamplerMismatch
from dpnotebook.grad_sample._engine.accumulation import grad_sample_rows
from dpnotebook.modes import Unwrappable

__all__ = [
    "reference_grad_samples",
    "check_grad_sampler",
    "GradSamplerReport",
    "dot_loss",
    "random_target",
]

Split = Callable[[tuple[Any, ...], int], tuple[Any, ...]]


def dot_loss(output: Tensor, target: Tensor) -> Tensor:
    """``sum(output * target)``: a loss whose backprops are ``target`` itself (no reduction)."""
    return (output * target).sum()


def random_target(module: nn.Module, inputs: Sequence[Any], seed: int = 0) -> Tensor:
    """A seeded random tensor shaped like ``module(*inputs)``, for :func:`dot_loss`."""
    with torch.no_grad():
        out = module(*inputs)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device)


def clean_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without the hooks of any dpnotebook wrapper on it."""
    from dpnotebook.grad_sample._engine.hooks import strip_dpnotebook_hooks

    return strip_dpnotebook_hooks(copy.deepcopy(module))


def _to64(x: Any) -> Any:
    return x.to(torch.float64) if isinstance(x, Tensor) and x.is_floating_point() else x


def reference_grad_samples(
    module: nn.Module,
    inputs: Sequence[Any],
    *,
    target: Tensor | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = dot_loss,
    K: int = 1,
    batch_first: bool = True,
    split: Split | None = None,
) -> dict[str, Tensor]:
    """Per-sample gradients by microbatching, in float64: the definition itself.

    Row ``r`` of ``inputs`` (``B*K`` rows, in dim 0 or, without ``batch_first``, dim 1) alone goes
    through a float64 copy of ``module``; sample ``i``'s gradient is the mean of the gradients of
    ``loss_fn(output_r, target_r)`` (default: :func:`dot_loss` with :func:`random_target`) over its rows
    ``i*K .. i*K+K-1``. ``split(inputs, r)``, if given, returns row ``r``'s inputs where slicing cannot
    (an EmbeddingBag's offsets).

    Returns:
        ``{parameter name: [B, *shape] float64 tensor}`` for every trainable parameter.

    >>> lin = nn.Linear(2, 1, bias=False)
    >>> with torch.no_grad():
    ...     _ = lin.weight.fill_(1.0)
    >>> x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> reference_grad_samples(lin, [x], target=torch.ones(2, 1), K=2)["weight"]
    tensor([[[2., 3.]]], dtype=torch.float64)
    """
    bd = 0 if batch_first else 1
    model = clean_copy(module).to(torch.float64)
    inputs = tuple(_to64(x) for x in inputs)
    target = _to64(random_target(model, inputs) if target is None else target)
    rows = target.shape[bd]
    if rows % K:
        raise ValueError(f"the inputs hold {rows} rows, which K={K} does not divide.")

    def by_slicing(inputs: tuple[Any, ...], r: int) -> tuple[Any, ...]:
        sliced = (isinstance(x, Tensor) and x.dim() > bd and x.shape[bd] == rows for x in inputs)
        return tuple(x.narrow(bd, r, 1) if s else x for x, s in zip(inputs, sliced, strict=True))

    split = split or by_slicing
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = {n: torch.zeros(rows // K, *p.shape, dtype=torch.float64, device=p.device) for n, p in named}
    for r in range(rows):
        loss = loss_fn(model(*split(inputs, r)), target.narrow(bd, r, 1))
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, _), g in zip(named, grads, strict=True):
            if g is not None:
                out[n][r // K] += g / K
    return out


@dataclass
class ReportRow:
    """One parameter under one strategy."""

    strategy: str
    name: str
    shape: tuple[int, ...]
    max_abs_err: float
    rel_err: float
    ok: bool


@dataclass
class GradSamplerReport:
    """Per-parameter comparison of grad samplers with the oracle: one :class:`ReportRow` per parameter and
    strategy, and the largest relative error accepted."""

    rows: list[ReportRow]
    tolerance: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def __str__(self) -> str:
        head = f"{'strategy':<46} {'parameter':<22} {'grad_sample shape':<20} {'max abs err':>12} {'rel err':>10}  ok"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r.strategy:<46} {r.name:<22} {str(list(r.shape)):<20} "
                f"{r.max_abs_err:>12.3e} {r.rel_err:>10.3e}  {'yes' if r.ok else 'NO'}"
            )
        lines.append(
            "relative error = max|got - oracle| / (largest |oracle| entry of any parameter), "
            f"accepted up to {self.tolerance:.0e}"
        )
        return "\n".join(lines)

    __repr__ = __str__


def wrapped_grad_samples(
    wrapper_factory: Callable[[nn.Module], nn.Module],
    module: nn.Module,
    inputs: Sequence[Any],
    target: Tensor,
    *,
    loss_reduction: str,
    batch_first: bool,
) -> dict[str, Tensor]:
    """``grad_sample`` of each trainable parameter after one backward through a wrapper."""
    wrapped = wrapper_factory(module)
    out = wrapped(*inputs)
    loss = dot_loss(out, target.to(out.dtype))
    if loss_reduction == "mean":
        loss = loss / target.shape[0 if batch_first else 1]
    loss.backward()
    result = {n: cast(Tensor, grad_sample_rows(p)) for n, p in module.named_parameters() if p.requires_grad}
    cast(Unwrappable, wrapped).to_standard_module()  # every mode's wrapper has it
    return result


def check_grad_sampler(
    module: nn.Module,
    *inputs: Tensor,
    K: int = 1,
    batch_first: bool = True,
    loss_reduction: str = "mean",
    dtype: torch.dtype = torch.float64,
    tolerance: float | None = None,
    split: Split | None = None,
    fallback: bool = True,
) -> GradSamplerReport:
    """Check the registered sampler (and the torch.func fallback) of ``module`` against the oracle.

    Args:
        module: the layer (or model) to check; it is copied, never changed.
        *inputs: its inputs, holding ``B*K`` rows (``K``, ``batch_first`` and ``split`` as in
            :func:`reference_grad_samples`; ``loss_reduction`` as in ``GradSampleModule``).
        dtype: run the samplers in this dtype (the oracle always uses float64).
        tolerance: largest accepted relative error (1e-10 for float64, 1e-5 for float32). An absolute
            error below 1e-12 (float64) or 1e-6 (float32) also passes, for gradients that are exactly zero.
        fallback: also check the torch.func fallback, which needs every batched input to hold the rows
            in the batch dim (turn it off for an EmbeddingBag's 1-D indices with offsets).

    Returns:
        A :class:`GradSamplerReport`; print it for a table.

    Raises:
        GradSamplerMismatch: some parameter is off; the message holds the report.
    """
    from dpnotebook.grad_sample import GradSampleModule

    tol = tolerance if tolerance is not None else (1e-10 if dtype == torch.float64 else 1e-5)
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    ref = reference_grad_samples(module, inputs, K=K, batch_first=batch_first, split=split)
    # one scale for the module (its largest oracle entry): a parameter whose true gradient is 0 is judged against it
    scale = max((r.abs().max().item() for r in ref.values() if r.numel()), default=0.0)
    target = random_target(clean_copy(module).to(torch.float64), tuple(_to64(x) for x in inputs))
    cast_inputs = tuple(x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() else x for x in inputs)
    rows: list[ReportRow] = []
    for force in [False, True] if fallback else [False]:
        copy_ = clean_copy(module).to(dtype)

        def factory(m: nn.Module, force: bool = force) -> GradSampleModule:
            return GradSampleModule(
                m, K=K, batch_first=batch_first, loss_reduction=loss_reduction, force_functorch=force
            )

        wrapped = factory(copy_)
        how = sorted({h for _, h in wrapped.units})
        wrapped.to_standard_module()
        if not force and how == ["torch.func"]:
            continue  # no registered sampler: the fallback row covers it
        label = "torch.func fallback" if force else f"registered sampler ({', '.join(how)})"
        got = wrapped_grad_samples(
            factory, copy_, cast_inputs, target, loss_reduction=loss_reduction, batch_first=batch_first
        )
        for name, r in ref.items():
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(r.shape):
                shape = tuple(g.shape) if g is not None else ()
                rows.append(ReportRow(label, name, shape, float("inf"), float("inf"), False))
                continue
            err = (g.to(torch.float64) - r).abs().max().item() if r.numel() else 0.0
            rel = err / scale if scale > 0 else err
            rows.append(ReportRow(label, name, tuple(g.shape), err, rel, rel <= tol or err <= atol))
    report = GradSamplerReport(rows, tol)
    if not report.ok:
        raise GradSamplerMismatch(f"per-sample gradients differ from the oracle:\n{report}", report)
    return report
