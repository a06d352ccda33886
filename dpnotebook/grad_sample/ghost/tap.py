"""How ghost mode hears of a layer's output gradient, and tells real ``.grad`` from none.

Ghost mode runs a layer with detached parameters, so autograd computes only
what flows back to the layer's input. To receive the gradient of the layer's
output it hooks that output; where nothing before the layer requires grad (the
model's first layers) the output would not require grad at all, and
:class:`Tap` gives it a place in the graph.

>>> import torch
>>> got = []
>>> w = torch.nn.Parameter(torch.ones(2))
>>> out = Tap.apply(torch.zeros(2), got.append, w)      # nothing before requires grad
>>> (3 * out).sum().backward()
>>> got[0], w.grad
(tensor([3., 3.]), None)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.accumulation import GradSampleStore


class Tap(torch.autograd.Function):
    """Identity on a layer's output that hands the output's gradient to ``sink``.

    Used where nothing before the layer requires grad (the model's first layers):
    its inputs include the layer's parameters, so the output requires grad all
    the same. ``mark_dirty`` returns the very tensor (no view), so in-place
    operations after the layer (``ReLU(inplace=True)``) work. Elsewhere a plain
    tensor hook on the output does (no graph change at all).
    """

    @staticmethod
    def forward(ctx: Any, out: Tensor, sink: Any, *params: Tensor) -> Tensor:
        ctx.sink, ctx.n_params = sink, len(params)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        ctx.sink(grad)
        return (grad, None) + (None,) * ctx.n_params


def grad_mark(p: nn.Parameter) -> tuple[int, int] | None:
    return None if p.grad is None else (id(p.grad), p.grad._version)


class GhostStore(GradSampleStore):
    """The hooks engine's store, told that a ghosted parameter whose ``.grad`` did not change got none.

    Autograd calls post-accumulate-grad hooks for the parameters fed to the tap
    even though the tap gives them no gradient; a parameter whose ``.grad``
    really changed was used outside its layer, and the store's check reports it.
    """

    def __init__(self, owner: Any) -> None:
        super().__init__(owner)
        self.marks: dict[int, tuple[int, int] | None] = {}

    def _on_grad(self, p: nn.Parameter) -> None:
        if id(p) not in self.marks or grad_mark(p) != self.marks[id(p)]:
            super()._on_grad(p)


__all__ = ["Tap", "GhostStore", "grad_mark"]
