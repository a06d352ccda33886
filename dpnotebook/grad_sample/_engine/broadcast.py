"""Batch-free tensors meeting the batch: per-sample gradients of broadcast parameters (hooks and ghost mode).

Some parameters never see the batch's rows inside a layer of their own: a position table looked up
with ``[1, T]`` ids, a T5 relative attention bias, a ViT class token, a layer scale held by a
container. :class:`BroadcastTracker` (a ``TorchFunctionMode``) follows the data flow of the forward
pass: where a batch-free tensor ``f`` that depends on trainable parameters meets the batch in a
recognised op (:data:`ELEMENTWISE`, :data:`JOINS` along a non-batch dim, :data:`ATTENTION`'s mask),
``f`` is replaced by a view broadcast to the rows, whose hook receives the per-row cotangent; summed
over each sample's rows, it is pushed back to the parameters with ``is_grads_batched=True``. An
unrecognised meeting, found by a first run on its own (the *discovery*), makes the smallest module
holding it a ``torch.func`` unit. The contract and its tests: docs/guarantees.md.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import GradSampleModule
>>> class Scaled(nn.Module):                        # a parameter held by the container
...     def __init__(self):
...         super().__init__()
...         self.fc = nn.Linear(3, 2)
...         self.gamma = nn.Parameter(torch.ones(2))
...     def forward(self, x):
...         return self.gamma * self.fc(x)
>>> model = GradSampleModule(Scaled())
>>> model(torch.randn(4, 3)).sum().backward()
>>> model.units
[('model.fc', 'linear_grad_sampler'), ('model.gamma', 'broadcast')]
>>> model.gamma.grad_sample.shape
torch.Size([4, 2])
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.calls import capture_is_paused, loss_scale

#: Broadcasting ops where a batch-free tensor may meet the batch: ``f`` is replaced by ``f_rows`` there.
ELEMENTWISE = frozenset(
    getattr(owner, name)
    for owner, names in (
        (torch, ("add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide")),
        (
            Tensor,
            (
                "add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_", "subtract", "__sub__", "__rsub__",
                "__isub__", "mul", "mul_", "multiply", "__mul__", "__rmul__", "__imul__", "div", "div_", "divide",
                "true_divide", "__truediv__", "__rtruediv__", "__itruediv__",
            ),
        ),
    )
    for name in names
)  # fmt: skip
#: Joins along a non-batch dim.
JOINS = frozenset({torch.cat, torch.concat, torch.concatenate, torch.stack})
#: Attention whose ``attn_mask`` (added to the scores, a T5 position bias) may be batch-free.
ATTENTION = frozenset({torch.nn.functional.scaled_dot_product_attention})
_IN_PLACE = frozenset(f for f in ELEMENTWISE if f.__name__.endswith("_") and not f.__name__.startswith("__"))
_IN_PLACE |= {Tensor.__iadd__, Tensor.__isub__, Tensor.__imul__, Tensor.__itruediv__}

Deps = frozenset  # ids of the trainable parameters a batch-free tensor depends on


def _tensors(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any] | None) -> Iterator[Tensor]:
    """The tensors among a call's arguments (one level of lists and tuples: ``torch.cat``'s)."""
    for a in (*args, *(kwargs.values() if kwargs else ())):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, Tensor))


@dataclass
class Capture:
    """One meeting point in one forward pass: ``f`` (batch-free) replaced by ``f_rows`` in a recognised op."""

    f: Tensor
    deps: Deps[Any]
    kind: str  # "expand": f broadcast over the rows; "rows": f has one row per batch row
    bd: int
    rows: int
    forward_id: int


class BroadcastTracker(TorchFunctionMode):
    """Tracks, in one wrapper's forward pass, which tensors hold the batch; captures batch-free parameters.

    Args:
        owner: the wrapper (its ``K``, ``loss_reduction``, ``batch_first``, store and ``_forward_id``).
    """

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self.owner = owner
        self.enabled = False  # run in the wrapper's forward passes (set by the discovery)
        self.discovered = False
        self.discovering = False
        self.probe: Callable[[str, nn.Module, Tensor], None] | None = None
        self.captured: dict[int, nn.Parameter] = {}  # parameters whose rows came from meeting points
        self.fallback_at: set[int] = set()  # modules that the discovery made torch.func units
        self.containers_fallback = False  # the discovery could not run: containers are torch.func units
        self.batch_free_units: set[int] = set()  # units the discovery saw called on batch-free inputs
        self.batched_units: set[int] = set()  # ... and on batched ones
        self.bad: list[tuple[str, str, list[str]]] = []  # unrecognised uses: (module path, op, parameter names)
        self.sites: set[str] = set()
        self._batched: dict[int, Any] = {}
        self._deps: dict[int, tuple[Any, Deps[Any]]] = {}
        self._params: dict[int, nn.Parameter] = {}
        self._unit_params: dict[int, nn.Parameter] = {}  # those of units called on batch-free inputs
        self._stack: list[str] = []
        self._depth = 0
        self._suspended = False
        self._handles: list[Any] = []
        self._installed: tuple[Any, ...] | None = None
        self._free: list[tuple[int, nn.Parameter]] = []
        self._tracking = False
        self._unit_calls: list[bool] = []

    # -- which tensors hold the batch ------------------------------------------
    def is_batched(self, t: Tensor) -> bool:
        ref = self._batched.get(id(t))
        return ref is not None and ref() is t

    def deps(self, t: Tensor) -> Deps[Any]:
        found = self._deps.get(id(t))
        if found is not None and found[0]() is t:
            return found[1]
        return frozenset((id(t),)) if id(t) in self._params else frozenset()

    def _mark(self, out: Any, batched: bool, deps: Deps[Any]) -> None:
        for t in [out] if isinstance(out, Tensor) else _tensors(out, None) if isinstance(out, (list, tuple)) else ():
            if batched:
                self._batched[id(t)] = weakref.ref(t)
                self._deps.pop(id(t), None)
            elif deps:
                self._deps[id(t)] = (weakref.ref(t), deps)

    def batch_free_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether a unit's call has no batched input (its rows are not samples): only while tracking."""
        if not self._tracking:
            return False
        if any(self.is_batched(x) for x in _tensors(args, kwargs)):  # the usual call, told cheaply
            return False
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
        return bool(leaves) and not any(self.is_batched(x) for x in leaves)

    @property
    def mixed_units(self) -> set[int]:
        """Units the discovery saw called both on batch-free and on batched inputs."""
        return self.batch_free_units & self.batched_units

    # -- entering and leaving a forward pass -------------------------------------
    @contextlib.contextmanager
    def tracking(self, args: tuple[Any, ...], kwargs: dict[str, Any], units: list[nn.Module]) -> Iterator[None]:
        """Track one forward pass of the model on ``args``/``kwargs``: every tensor among them is batched."""
        self._install(units)
        self._params = {i: p for i, p in self._free if p.requires_grad}
        for x in tree_flatten((args, kwargs))[0]:  # every input tensor is data (a mask, flat ids, packed rows)
            if isinstance(x, Tensor):
                self._batched[id(x)] = weakref.ref(x)
        self._tracking = True
        try:
            with self:
                try:
                    yield
                finally:
                    if self._suspended:  # the forward raised inside a unit: the mode goes back for __exit__
                        torch._C._push_on_torch_function_stack(self)
                        self._suspended = False
        finally:
            self._tracking = False
            self._stack, self._depth, self._unit_calls = [], 0, []
            self._batched, self._deps = {}, {}

    def _install(self, units: list[nn.Module]) -> None:
        """Hooks on every module of the model (kept between forward passes while the units stay the same)."""
        model = self.owner._module
        key = (tuple(id(m) for m in units), sum(1 for _ in model.modules()))
        if key == self._installed:
            return
        self.remove()
        # the parameters no unit handles (a container's): those of a unit are its sampler's business, or
        # enter the tracking as the output of its call on batch-free inputs (see _leave)
        in_units = {id(p) for m in units for p in m.parameters()}
        self._free = [(id(p), p) for p in model.parameters() if id(p) not in in_units]
        unit_ids = {id(m) for m in units}
        for path, m in model.named_modules(prefix="model"):
            unit = id(m) in unit_ids
            self._handles.append(m.register_forward_pre_hook(partial(self._enter, path, unit), with_kwargs=True))
            self._handles.append(
                m.register_forward_hook(partial(self._leave, unit), with_kwargs=True, always_call=True)
            )
        self._installed = key

    def remove(self) -> None:
        """Remove the hooks of :meth:`_install` (the wrapper's ``remove_hooks`` calls it)."""
        for h in self._handles:
            h.remove()
        self._handles, self._installed = [], None

    def _enter(self, path: str, unit: bool, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._tracking:
            return
        self._stack.append(path)
        if unit:
            batch_free = self.batch_free_call(args, kwargs)
            self._unit_calls.append(batch_free)
            self._depth += 1
            if self._depth == 1 and torch._C._len_torch_function_stack() and self._suspend():
                self._suspended = True  # a unit's ops are its own business: not intercepted (the time it saves)
            if self.discovering:
                (self.batch_free_units if batch_free else self.batched_units).add(id(module))

    def _leave(self, unit: bool, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self._tracking:
            return
        if self._stack:
            self._stack.pop()
        if not unit or not self._unit_calls:
            return
        self._depth -= 1
        if self._depth == 0 and self._suspended:
            torch._C._push_on_torch_function_stack(self)
            self._suspended = False
        batch_free = self._unit_calls.pop()
        if output is None:
            return
        if batch_free:
            leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
            deps = frozenset().union(*(self.deps(x) for x in leaves))
            own = {id(p): p for p in module.parameters() if p.requires_grad}
            self._unit_params.update(own)
            deps |= own.keys()
            self._mark_tree(output, False, deps)
        else:
            self._mark_tree(output, True, frozenset())

    def _suspend(self) -> bool:
        """Take this mode off the top of the torch-function mode stack, if it is there."""
        top = torch._C._pop_torch_function_stack()
        if top is not self:
            torch._C._push_on_torch_function_stack(top)
            return False
        return True

    def _mark_tree(self, output: Any, batched: bool, deps: Deps[Any]) -> None:
        for x in tree_flatten(output)[0]:
            if isinstance(x, Tensor):
                self._mark(x, batched, deps)

    # -- every op of the forward pass --------------------------------------------
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        batched, free = False, []
        for t in _tensors(args, kwargs):
            if self.is_batched(t):
                batched = True
            elif self._depth == 0:
                d = self.deps(t)
                if d:
                    free.append((t, d))
        if batched and free and self._depth == 0:
            return self._meet(func, args, kwargs, free)
        out = func(*args, **kwargs)
        if batched:
            self._mark(out, True, frozenset())
            if func in _IN_PLACE or getattr(func, "__name__", "") == "__setitem__":
                self._mark(args[0], True, frozenset())
        elif free:
            self._mark(out, False, frozenset().union(*(d for _, d in free)))
        return out

    def _meet(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], free: list[tuple[Tensor, Deps[Any]]]
    ) -> Any:
        """A batch-free tensor that depends on trainable parameters meets the batch."""
        owner = self.owner
        bd, rows = 0 if owner.batch_first else 1, owner._rows_input
        live = not self.discovering and not capture_is_paused() and owner.hooks_enabled and torch.is_grad_enabled()
        if live:
            free = [(t, d) for t, d in free if t.requires_grad]
            if not free:
                out = func(*args, **kwargs)
                self._mark(out, True, frozenset())
                return out
        subs = self._substitutes(func, args, kwargs, free, bd, rows)
        if subs is None:
            self._unrecognised(func, free)
            out = func(*args, **kwargs)
        else:
            site = f"{self._stack[-1] if self._stack else 'model'}: {getattr(func, '__name__', func)}"
            self.sites.add(site)
            for _, d in free:
                self.captured.update((i, self._params[i] if i in self._params else self._unit_params[i]) for i in d)
            swap = {id(t): rows_view for t, rows_view, _ in subs}
            args, kwargs = _replace(args, swap), _replace(kwargs, swap)
            out = func(*args, **kwargs)
            if live:
                for t, rows_view, kind in subs:
                    cap = Capture(t, self.deps(t), kind, bd, rows, owner._forward_id)
                    rows_view.register_hook(partial(self._on_cotangent, cap))
            elif self.probe is not None and isinstance(out, Tensor):
                self.probe(site, owner._module, out)
        self._mark(out, True, frozenset())
        if func in _IN_PLACE:
            self._mark(args[0], True, frozenset())
        return out

    def _substitutes(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], free: list[Any], bd: int, rows: int | None
    ) -> list[tuple[Tensor, Tensor, str]] | None:
        """``(f, f_rows, kind)`` for each batch-free operand, or ``None`` where the op is not recognised."""
        if rows is None:
            return None
        if func in ELEMENTWISE:
            operands = [a for a in (*args[:2], kwargs.get("other")) if isinstance(a, Tensor)]
            if func in _IN_PLACE and any(args[0] is t for t, _ in free):
                return None  # the batch-free tensor itself would become batched
            nd = max(a.dim() for a in operands)
            big = [a for a in operands if self.is_batched(a)]
            if not all(b.dim() == nd and b.shape[bd] == rows for b in big):
                return None  # the batch is not where the input holds it
            subs = [_to_rows(t, nd, bd, rows) for t, _ in free]
            return [sub for sub in subs if sub is not None] if all(subs) else None
        if func in ATTENTION:
            mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
            q = args[0] if args else kwargs.get("query")
            if not (len(free) == 1 and free[0][0] is mask and isinstance(q, Tensor) and self.is_batched(q)):
                return None  # a batch-free query, key or value: not a broadcast
            if q.dim() <= bd or q.shape[bd] != rows:
                return None
            sub = _to_rows(mask, q.dim(), bd, rows)
            return [sub] if sub is not None else None
        if func in JOINS:
            tensors = args[0] if args else kwargs.get("tensors")
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
                return None
            nd = tensors[0].dim() + (func is torch.stack)
            dim = dim % nd
            if dim <= bd if func is torch.stack else dim == bd:
                return None  # joined along the batch dim, or moving it
            if not all(t.dim() > bd and t.shape[bd] == rows for t in tensors):
                return None
            return [(t, t.view(t.shape), "rows") for t, _ in free]
        return None

    def _unrecognised(self, func: Any, free: list[tuple[Tensor, Deps[Any]]]) -> None:
        names = {id(p): n for n, p in self.owner._module.named_parameters(prefix="model", remove_duplicate=False)}
        params = sorted(names[i] for _, d in free for i in d if i in names)
        where = self._stack[-1] if self._stack else "model"
        op = getattr(func, "__name__", str(func))
        if self.discovering:
            self.bad.append((where, op, params))
            return
        raise GradSampleError(
            f"{', '.join(params)} meet(s) the batch in {op} inside {where}, an op whose per-sample gradients "
            "ghost and hooks mode cannot split (only add, sub, mul, div and torch.cat/stack along a non-batch "
            "dim are recognised), and this use was not seen by the first forward pass, which made such modules "
            "torch.func units. Register a grad sampler for the module (dpnotebook.register_grad_sampler), "
            "or use grad_sample_mode='functorch'."
        )

    # -- backward: the per-row cotangent becomes per-sample gradients ----------------
    def _on_cotangent(self, cap: Capture, g: Tensor) -> None:
        owner = self.owner
        if not owner.hooks_enabled:
            return
        K, rows, bd = owner.K, cap.rows, cap.bd
        B = rows // K
        f = cap.f
        gr = g.movedim(bd, 0)  # [rows, *rest]
        rest = gr.shape[1:]
        if cap.kind == "expand":
            per_sample = gr.reshape(B, K, *f.shape).sum(1)
        else:  # sample b's cotangent: its own rows of g, zeros elsewhere
            own = gr.reshape(B, K, *rest)
            full = own.new_zeros(B, B, K, *rest)
            index = torch.arange(B, device=g.device)
            full[index, index] = own
            per_sample = full.reshape(B, rows, *rest).movedim(1, bd + 1).reshape(B, *f.shape)
        per_sample = per_sample * (loss_scale(owner.loss_reduction, rows) / K)
        params = [self.captured[i] for i in sorted(cap.deps)]
        if len(params) == 1 and params[0] is f:
            grads: tuple[Any, ...] = (per_sample,)
        else:
            grads = torch.autograd.grad(
                f, params, per_sample, retain_graph=True, allow_unused=True, is_grads_batched=True
            )
        for p, gp in zip(params, grads, strict=True):
            if gp is not None:
                owner._store.add(p, gp.detach(), cap.forward_id)


def _to_rows(t: Tensor, nd: int, bd: int, rows: int) -> tuple[Tensor, Tensor, str] | None:
    """``(t, t_rows, kind)``: ``t`` aligned to ``nd`` dims and broadcast to the batch's ``rows``, or None."""
    al = t.reshape((1,) * (nd - t.dim()) + tuple(t.shape))
    if al.shape[bd] == 1:
        return t, al.expand(*[rows if i == bd else -1 for i in range(al.dim())]), "expand"
    return (t, al.view(al.shape), "rows") if al.shape[bd] == rows else None


def _replace(tree: Any, swap: dict[int, Tensor]) -> Any:
    if isinstance(tree, Tensor):
        return swap.get(id(tree), tree)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_replace(x, swap) for x in tree)
    if isinstance(tree, dict):
        return {k: _replace(v, swap) for k, v in tree.items()}
    return tree


def smallest_holder(op_path: str, param_paths: list[str]) -> str:
    """The deepest module path that holds the op's module and every parameter: the torch.func unit for it.

    >>> smallest_holder("model.enc", ["model.enc.w", "model.enc.blocks.0.fc.weight"])
    'model.enc'
    >>> smallest_holder("model.a.b", ["model.c.w"])
    'model'
    """
    parts = [op_path.split(".")] + [p.split(".")[:-1] for p in param_paths]
    common = []
    for level in zip(*parts, strict=False):  # the common prefix: it ends with the shortest path
        if any(x != level[0] for x in level):
            break
        common.append(level[0])
    return ".".join(common) or "model"


__all__ = ["BroadcastTracker", "Capture", "ELEMENTWISE", "JOINS", "smallest_holder"]
