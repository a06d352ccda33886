"""Recording layer calls in the forward pass and turning backprops into ``grad_sample``.

:class:`LayerHooks` is the machinery behind :class:`GradSampleModule`: a forward
hook on each *unit* (a layer with a registered sampler, or a subtree computed by
the ``torch.func`` fallback) records what the layer saw and registers a hook on
its outputs; when their gradients arrive, the unit's per-sample gradients are
computed and added to ``p.grad_sample``.

A layer's sampler sees only the part of each sample's gradient that flows through the layer's own
forward. If the model also uses the layer's parameter elsewhere (``F.linear(x, self.fc.weight)`` in
a parent), that other part reaches ``p.grad`` but no sampler sees it, and DP-SGD would clip
per-sample gradients that miss it: silently wrong. So during a sampled layer's forward each
trainable parameter is swapped for an alias ``p.view_as(p)`` whose autograd node is marked; at the
end of the wrapper's forward the graph is walked once from the output, and an edge into a watched
parameter's ``AccumulateGrad`` node from anything but a marked alias is refused
(:func:`outside_use`; structural, so no comparison of sums that samples could cancel). Tied weights
go through aliases in both layers, and pass. Not watched: the parameters of ``torch.func`` units and
of DP layers whose children hold the samplers (``_dpn_grad_samples_from_children``, e.g. ``DPLSTM``).

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
from dpnotebook.grad_sample._engine.precision import autocast_off, full_precision
from dpnotebook.grad_sample._registry import SamplerEntry


@lru_cache(maxsize=512)
def _method_signature(function: Any) -> inspect.Signature:
    """The signature of a ``forward`` method without ``self`` (computing one takes ~0.1 ms)."""
    sig = inspect.signature(function)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _class_forward(module: nn.Module) -> Any:
    """The function behind ``module.forward``, or ``None`` for a forward set on the instance (nothing to cache by)."""
    forward = module.forward
    function = getattr(forward, "__func__", None)
    return function if getattr(forward, "__self__", None) is module else None


def forward_signature(module: nn.Module) -> inspect.Signature:
    """``inspect.signature(module.forward)``, cached per class's ``forward`` (it runs at every layer call).

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
    """How many arguments ``module.forward`` takes, all positional; -1 if it takes others (or is set on the instance)."""
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
    """A recorded activation or backprop as per-sample work reads it: batch first, and in float32 if it was
    recorded in a reduced type under autocast (:mod:`~dpnotebook.grad_sample._engine.precision`)."""
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
    # Gradients are linear in the backprops, so the loss reduction can be undone on either
    # side: on the backprops or on the B per-sample gradients, whichever is smaller.
    size = B * sum(p.numel() for p in module._parameters.values() if p is not None and p.requires_grad)
    if scale != 1.0 and bp.numel() < size:
        bp, scale = bp * scale, 1.0
    if entry.takes_k:
        found = entry.form(acts, bp)(module, acts, bp, K)
    else:  # Opacus-style: per-row gradients, averaged over each sample's K rows here
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
    """The error for a backward pass through a forward pass whose per-sample gradients were already formed."""
    return GradSampleError(
        f"{call.path} ({type(call.module).__name__}): backward ran a second time through the same "
        f"forward pass (retain_graph=True), but {mode} mode forms the per-sample gradients of a "
        "forward pass once and has let go of its activations. Run the forward pass again for each backward."
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
        # parameters of sampled layers, swapped for aliases during their forward (see outside_use); not those of
        # torch.func units, nor of DP layers whose children hold the samplers (DPLSTM runs its recurrence on its
        # children's parameters outside their forward, and their samplers account for it)
        self.watched: dict[int, nn.Parameter] = {}
        self._swapped: dict[int, list[list[Any]]] = {}
        shared = [m for m in owner._module.modules() if getattr(m, "_dpn_grad_samples_from_children", False)]
        inside_shared = {id(s) for m in shared for s in m.modules()}
        self._unwatched = frozenset(id(p) for _, m, e in units if e is None for p in m.parameters())
        for path, module, entry in units:
            hook = partial(self._record, path, entry)
            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))
            if entry is not None and module is not owner._module and id(module) not in inside_shared:
                self._guard(module, [module])

    def _guard(self, module: nn.Module, subtree: list[nn.Module]) -> None:
        """Alias the parameters of ``subtree`` during ``module``'s forward (see :mod:`.outside_use`)."""
        self.handles.append(module.register_forward_pre_hook(partial(self._alias, subtree)))
        self.handles.append(module.register_forward_hook(self._restore, prepend=True, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _alias(self, subtree: list[nn.Module], module: nn.Module, args: tuple[Any, ...]) -> None:
        owner = self.owner
        active = owner.hooks_enabled and owner._in_forward and torch.is_grad_enabled() and not capture_is_paused()
        swapped = alias_parameters(subtree, self.watched, self._unwatched) if active else []
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
                f"{path} ({type(module).__name__}) returned shape {tuple(first.shape)}, which has no "
                f"batch dim {bd} (batch_first={owner.batch_first}). With batch_first=False inputs are "
                "[T, B*K, ...]; check the batch_first argument of GradSampleModule."
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
            raise second_backward_error(call, "hooks")
        K, scale = owner.K, loss_scale(owner.loss_reduction, call.rows)
        backprops = grads[0]
        if entry is not None and backprops is None:
            return
        with autocast_off():  # a backward() inside torch.autocast: the per-sample work stays float32
            if entry is None:
                found = fallback_grad_samples(call, list(grads), K, scale, owner.replay_chunk)
            else:
                assert backprops is not None  # returned above
                found = sampler_grad_samples(entry, call, backprops, K, scale)
        call.release()
        for p, g in found.items():
            owner._store.add(p, g.detach(), call.forward_id)


_MARK = "dpn_in_layer"


def _accumulate_grad_type() -> type:
    node = torch.zeros(1, requires_grad=True).view_as(torch.zeros(1)).grad_fn
    assert node is not None  # a view of a leaf that requires grad always has one
    return type(node.next_functions[0][0])


_ACCUMULATE_GRAD = _accumulate_grad_type()


def mark_in_layer(node: Any) -> None:
    """Mark an autograd node as a layer's own use of the parameters it leads to (aliases, ghost taps)."""
    node.metadata[_MARK] = True


def alias_parameters(
    modules: Any, watched: dict[int, nn.Parameter], exclude: frozenset[Any] = frozenset()
) -> list[Any]:
    """Swap the trainable parameters of ``modules`` for marked aliases; return what :func:`restore_parameters` needs.

    Each swapped parameter is added to ``watched`` (``id -> parameter``) unless its id is in ``exclude``
    (a parameter also used by a ``torch.func`` unit, whose forward is not aliased).
    """
    swapped = []
    for module in modules:
        params, pairs = module._parameters, []
        for name, p in params.items():
            if p is not None and p.requires_grad and isinstance(p, nn.Parameter):
                alias = p.view_as(p)
                mark_in_layer(alias.grad_fn)
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
