"""Refusing a parameter used outside its layer's forward (hooks mode).

A layer's grad sampler computes the part of each sample's gradient that flows
through the layer's own forward. If the model also uses the layer's parameter
elsewhere (``F.linear(x, self.fc.weight)`` in a parent, while ``self.fc`` is
called too), that other part reaches ``p.grad`` but no sampler sees it, and
DP-SGD would clip per-sample gradients that miss it: silently wrong.

How it is caught, structurally (no comparison of sums that samples could cancel):
during a sampled layer's forward each trainable parameter is swapped for an
alias ``p.view_as(p)`` whose autograd node is marked; at the end of the
wrapper's forward the autograd graph is walked once from the output, and an
edge into a watched parameter's ``AccumulateGrad`` node from anything but a
marked alias is refused. Weights tied between two sampled layers go through
aliases in both, and pass. Not watched: the parameters of ``torch.func`` units
and of DP layers whose children hold the samplers (``_dpn_grad_samples_from_children``,
e.g. ``DPLSTM``, which runs its recurrence on its children's parameters: their
samplers account for that use).

>>> import torch
>>> from torch import nn
>>> fc = nn.Linear(2, 2)
>>> swapped = alias_parameters([fc], {})               # what the layer's forward pre-hook does
>>> h = fc(torch.randn(3, 2))
>>> restore_parameters(swapped)                      # and its forward hook
>>> outside_use([h], {id(fc.weight), id(fc.bias)}) is None
True
>>> outside_use([h + fc.weight.sum()], {id(fc.weight), id(fc.bias)}) is fc.weight   # used outside too
True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

_MARK = "dpn_in_layer"


def _accumulate_grad_type() -> type:
    node = torch.zeros(1, requires_grad=True).view_as(torch.zeros(1)).grad_fn
    assert node is not None  # a view of a leaf that requires grad always has one
    return type(node.next_functions[0][0])


_ACCUMULATE_GRAD = _accumulate_grad_type()


def mark_in_layer(node: Any) -> None:
    """Mark an autograd node as a layer's own use of the parameters it leads to (aliases, ghost taps)."""
    node.metadata[_MARK] = True


def alias_parameters(modules: Any, watched: dict[int, nn.Parameter], exclude: frozenset = frozenset()) -> list:
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


def restore_parameters(swapped: list) -> None:
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


__all__ = ["alias_parameters", "restore_parameters", "outside_use", "mark_in_layer"]
