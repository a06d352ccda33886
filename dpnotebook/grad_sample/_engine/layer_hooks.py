"""Recording layer calls in the forward pass and turning backprops into ``grad_sample``.

:class:`LayerHooks` puts a forward hook on each *unit* (a layer with a registered sampler, or a
subtree for the ``torch.func`` fallback): it records what the layer saw and hooks its outputs; when
their gradients arrive, the unit's per-sample gradients are added to ``p.grad_sample``.

A sampler sees only the part of a gradient that flows through its layer's own forward: a parameter
also used elsewhere (``F.linear(x, self.fc.weight)`` in a parent) would be clipped without that
part. So during a sampled layer's forward its parameters are swapped for marked aliases, and
:func:`outside_use` walks the graph once per forward pass: an edge into a watched parameter from
anything but a marked alias is refused (tied weights go through aliases in both layers, and pass).

>>> import torch
>>> from torch import nn
>>> fc = nn.Linear(2, 2)
>>> swapped = alias_parameters([fc], {})               # what the layer's forward pre-hook does
>>> h = fc(torch.randn(3, 2))
>>> restore_parameters(swapped)                      # and its forward hook
>>> outside_use([h + fc.weight.sum()], {id(fc.weight), id(fc.bias)}) is fc.weight   # used outside too
True
"""

from __future__ import annotations

import inspect
from functools import lru_cache, partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.calls import (
    LayerCall,
    capture_is_paused,
    detach_tree,
    fallback_grad_samples,
    loss_scale,
)
from dpnotebook.grad_sample._engine.precision import exact_float32, full_precision
from dpnotebook.grad_sample._registry import SamplerEntry


@lru_cache(maxsize=512)
def _method_signature(function: Any) -> inspect.Signature:
    """The signature of a ``forward`` method without ``self``, cached: it is needed at every layer call."""
    sig = inspect.signature(function)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _class_forward(module: nn.Module) -> Any:
    """The function behind ``module.forward``, or ``None`` for a forward set on the instance."""
    forward = module.forward
    function = getattr(forward, "__func__", None)
    return function if getattr(forward, "__self__", None) is module else None


def forward_signature(module: nn.Module) -> inspect.Signature:
    """``inspect.signature(module.forward)``, cached per class's ``forward``.

    >>> from torch import nn
    >>> str(forward_signature(nn.Linear(2, 2)))
    '(input: torch.Tensor) -> torch.Tensor'
    """
    function = _class_forward(module)
    return inspect.signature(module.forward) if function is None else _method_signature(function)


@lru_cache(maxsize=512)
def _method_arity(function: Any) -> int:
    params = _method_signature(function).parameters.values()
    return len(params) if all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) else -1


def _positional_arity(module: nn.Module) -> int:
    """How many arguments ``module.forward`` takes, all positional; -1 if it takes others."""
    function = _class_forward(module)
    return -1 if function is None else _method_arity(function)


def bound_arguments(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The forward's arguments in signature order, defaults filled in (``activations``).

    >>> from torch import nn
    >>> bound_arguments(nn.EmbeddingBag(3, 2), ("idx",), {"offsets": "off"})
    ['idx', 'off', None]
    """
    if not kwargs and len(args) == _positional_arity(module):  # nothing to bind or fill in
        return list(args)
    sig = forward_signature(module)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return [*args, *kwargs.values()]
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.values())


def to_batch_first(x: Any, batch_dim: int) -> Any:
    """A recorded activation or backprop as per-sample work reads it: batch first, in full precision."""
    x = full_precision(x)
    if batch_dim == 0 or not isinstance(x, Tensor) or x.dim() < 2:
        return x
    return x.movedim(batch_dim, 0)


def sampler_grad_samples(
    entry: SamplerEntry, call: LayerCall, backprops: Tensor, K: int, scale: float
) -> dict[nn.Parameter, Tensor]:
    """Run a registered sampler on one recorded call, checking what it returns."""
    module = call.module
    acts = [to_batch_first(a, call.batch_dim) for a in bound_arguments(module, call.args, call.kwargs)]
    bp = to_batch_first(backprops, call.batch_dim)
    B = call.rows // K
    # gradients are linear in the backprops: undo the loss reduction on them or on the results, the smaller
    size = B * sum(p.numel() for p in module._parameters.values() if p is not None and p.requires_grad)
    if scale != 1.0 and bp.numel() < size:
        bp, scale = bp * scale, 1.0
    if entry.takes_k:
        found = entry.form(acts, bp)(module, acts, bp, K)
    else:  # a sampler without K: per-row gradients, averaged over each sample's K rows here
        found = {p: g.reshape(B, K, *g.shape[1:]).mean(1) for p, g in entry.fn(module, acts, bp).items()}
    if scale != 1.0:
        found = {p: g * scale for p, g in found.items()}
    direct = {id(p) for p in module._parameters.values() if p is not None}  # the usual case, checked cheaply
    for p, g in found.items():
        if id(p) not in direct and all(q is not p for q in module.parameters()):
            raise GradSampleError(
                f"grad sampler {entry.name!r} for {call.path} returned a tensor for a parameter "
                f"that is not one of {type(module).__name__}'s own ({sorted(n for n, _ in module.named_parameters())})."
            )
        if tuple(g.shape) != (B, *p.shape):
            name = next(n for n, q in module.named_parameters() if q is p)
            raise GradSampleError(
                f"grad sampler {entry.name!r} for {call.path} returned shape {tuple(g.shape)} for "
                f"{name!r}; expected [B, *param.shape] = {(B, *p.shape)} with B={B} samples "
                f"of K={K} rows each."
            )
    return found


def second_backward_error(call: LayerCall, mode: str) -> GradSampleError:
    """The error for a second backward pass through a forward pass whose per-sample gradients were formed."""
    return GradSampleError(
        f"{call.path} ({type(call.module).__name__}): backward ran a second time through the same forward "
        f"pass (retain_graph=True), but {mode} mode has let go of its activations. Run the forward pass again."
    )


class LayerHooks:
    """Forward/backward hooks on the units of one wrapped model.

    Args:
        units: ``(path, module, sampler entry or None for the torch.func fallback)``.
        owner: the :class:`GradSampleModule` that holds the settings and the storage.
    """

    def __init__(self, units: list[tuple[str, nn.Module, SamplerEntry | None]], owner: Any) -> None:
        self.units = units
        self.owner = owner
        self.handles: list[Any] = []
        # parameters aliased during their layer's forward (see outside_use): not those of torch.func units, nor
        # of DP layers whose children hold the samplers (DPLSTM runs its children's parameters itself)
        self.watched: dict[int, nn.Parameter] = {}
        self._swapped: dict[int, list[list[Any]]] = {}
        shared = [m for m in owner._module.modules() if getattr(m, "_dpn_grad_samples_from_children", False)]
        inside_shared = {id(s) for m in shared for s in m.modules()}
        self._unwatched = frozenset(id(p) for _, m, e in units if e is None for p in m.parameters())
        for path, module, entry in units:
            hook = partial(self._record, path, entry)
            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))
            if entry is not None and module is not owner._module and id(module) not in inside_shared:
                self.handles.append(module.register_forward_pre_hook(self._alias))
                self.handles.append(module.register_forward_hook(self._restore, prepend=True, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _alias(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        owner = self.owner
        active = owner.hooks_enabled and owner._in_forward and torch.is_grad_enabled() and not capture_is_paused()
        swapped = alias_parameters([module], self.watched, self._unwatched) if active else []
        self._swapped.setdefault(id(module), []).append(swapped)

    def _restore(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        stack = self._swapped.get(id(module))
        if stack:
            restore_parameters(stack.pop())

    def _batch_dim(self, module: nn.Module, entry: SamplerEntry | None) -> int:
        if getattr(module, "_dpn_batch_first", False) or (entry is not None and entry.batch_first_always):
            return 0
        return 0 if self.owner.batch_first else 1

    def _record(
        self,
        path: str,
        entry: SamplerEntry | None,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        owner = self.owner
        if not owner.hooks_enabled or capture_is_paused() or not torch.is_grad_enabled():
            return
        if not any(p.requires_grad for p in module.parameters(recurse=entry is None)):
            return
        if owner._broadcast.batch_free_call(args, kwargs):  # no rows of samples: the meeting points take it
            return
        leaves, _ = tree_flatten(output)
        out_index = [i for i, x in enumerate(leaves) if isinstance(x, Tensor) and x.requires_grad]
        if not out_index:
            return
        bd = self._batch_dim(module, entry)
        first = leaves[out_index[0]]
        if first.dim() <= bd:
            raise GradSampleError(
                f"{path} ({type(module).__name__}) returned shape {tuple(first.shape)}, which has no batch dim "
                f"{bd} (batch_first={owner.batch_first}): with batch_first=False, inputs are [T, B*K, ...]."
            )
        rows = first.shape[bd]
        owner._check_rows(path, module, rows, bd)
        call = LayerCall(module, path, detach_tree(args), detach_tree(kwargs), out_index, bd, rows, owner._forward_id)
        on_grads = partial(self._on_grads, entry, call)
        if len(out_index) == 1:  # what register_multi_grad_hook does for one tensor, without its set-up
            first.register_hook(lambda grad: on_grads([grad]))
        else:
            register_multi_grad_hook([leaves[i] for i in out_index], on_grads, mode="all")

    def _on_grads(self, entry: SamplerEntry | None, call: LayerCall, grads: list[Tensor | None]) -> None:
        owner = self.owner
        if not owner.hooks_enabled:
            return
        if call.released:
            raise second_backward_error(call, owner.grad_sample_mode)
        K, scale = owner.K, loss_scale(owner.loss_reduction, call.rows)
        with exact_float32():  # a backward() inside torch.autocast: the per-sample work stays float32
            if entry is None:
                found = fallback_grad_samples(call, list(grads), K, scale, owner.replay_chunk)
            elif grads[0] is not None:
                found = sampler_grad_samples(entry, call, grads[0], K, scale)
            else:
                return
        call.release()
        for p, g in found.items():
            owner._store.add(p, g.detach(), call.forward_id)


_MARK = "dpn_in_layer"


_LEAF_VIEW = torch.zeros(1, requires_grad=True).view(1)
_ACCUMULATE_GRAD = type(_LEAF_VIEW.grad_fn.next_functions[0][0])  # type: ignore[union-attr]


def alias_parameters(
    modules: Any, watched: dict[int, nn.Parameter], exclude: frozenset[Any] = frozenset()
) -> list[Any]:
    """Swap the trainable parameters of ``modules`` for marked aliases; return what :func:`restore_parameters` needs.

    Each is added to ``watched`` unless its id is in ``exclude`` (also used by a ``torch.func`` unit).
    """
    swapped = []
    for module in modules:
        params, pairs = module._parameters, []
        for name, p in params.items():
            if p is not None and p.requires_grad and isinstance(p, nn.Parameter):
                alias = p.view_as(p)
                alias.grad_fn.metadata[_MARK] = True  # type: ignore[union-attr, index]
                params[name] = alias
                pairs.append((name, p))
                if id(p) not in exclude:
                    watched[id(p)] = p
        if pairs:
            swapped.append((module, pairs))
    return swapped


def restore_parameters(swapped: list[Any]) -> None:
    """Put back the parameters :func:`alias_parameters` swapped."""
    for module, pairs in swapped:
        for name, p in pairs:
            module._parameters[name] = p


def outside_use(outputs: list[Tensor], watched: set[int] | dict[int, Any]) -> Any:
    """The first watched parameter the graph behind ``outputs`` reaches other than through a marked alias, or None."""
    stack = [t.grad_fn for t in outputs if isinstance(t, Tensor) and t.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for fn, _ in node.next_functions:
            if fn is None:
                continue
            if type(fn) is _ACCUMULATE_GRAD:
                # torch's Node stub lacks AccumulateGrad's ``variable`` and types ``metadata`` (a dict) as a method
                if id(fn.variable) in watched and _MARK not in node.metadata:  # type: ignore[attr-defined, operator]
                    return fn.variable  # type: ignore[attr-defined]
            elif fn not in seen:
                stack.append(fn)
    return None
