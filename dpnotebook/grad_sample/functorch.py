"""``make_functional`` and ``prepare_layer``: per-row gradients of one layer with ``torch.func``.

``make_functional(module)`` gives ``(fmodel, params)`` with ``fmodel(params, *inputs)``;
``prepare_layer(layer)`` sets ``layer.ft_compute_sample_grad(params, activations, backprops)``,
the per-row gradients of ``<layer(activations), backprops>``.

>>> import torch
>>> from torch import nn
>>> layer = nn.Linear(3, 2)
>>> fmodel, params = make_functional(layer)
>>> x = torch.randn(4, 3)
>>> torch.allclose(fmodel(params, x), layer(x))
True
>>> prepare_layer(layer)
>>> grads = layer.ft_compute_sample_grad(params, x, torch.ones(4, 2))
>>> [tuple(g.shape) for g in grads]
[(4, 2, 3), (4, 2)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

__all__ = ["make_functional", "prepare_layer", "ft_compute_per_sample_gradient"]


def make_functional(
    mod: nn.Module, disable_autograd_tracking: bool = False
) -> tuple[Callable[..., Any], tuple[Tensor, ...]]:
    """``(fmodel, params)``: ``fmodel(new_params, *args, **kwargs)`` runs ``mod`` with ``new_params`` in place of its own.

    Args:
        mod: the module; its buffers are used as they are.
        disable_autograd_tracking: return detached parameters.
    """
    names = [n for n, _ in mod.named_parameters()]
    values = tuple(p.detach() if disable_autograd_tracking else p for p in mod.parameters())

    def fmodel(new_params: tuple[Tensor, ...], *args: Any, **kwargs: Any) -> Any:
        return functional_call(mod, dict(zip(names, new_params, strict=True)), args, kwargs)

    return fmodel, values


def prepare_layer(layer: nn.Module, batch_first: bool = True) -> None:
    """Give ``layer`` a ``ft_compute_sample_grad(params, activations, backprops)`` (per-row gradients, vmapped).

    Raises:
        NotImplementedError: the layer has buffers (they would be shared by all rows), or is an
            ``EmbeddingBag`` (its rows are bags of a flat input).
    """
    if any(True for _ in layer.buffers()):
        raise NotImplementedError(f"{type(layer).__name__} has buffers; its per-row gradients cannot be vmapped.")
    if isinstance(layer, nn.EmbeddingBag):
        raise NotImplementedError("EmbeddingBag cannot be vmapped row by row (its rows are bags of a flat input).")
    fmodel, _ = make_functional(layer)
    dim = 0 if batch_first else 1

    def row_loss(params: tuple[Tensor, ...], activations: Tensor, backprops: Tensor) -> Tensor:
        return (fmodel(params, activations.unsqueeze(dim)) * backprops.unsqueeze(dim)).sum()

    setattr(layer, "ft_compute_sample_grad", vmap(grad(row_loss), in_dims=(None, 0, 0)))


def ft_compute_per_sample_gradient(
    layer: nn.Module, activations: list[Tensor], backprops: Tensor
) -> dict[nn.Parameter, Tensor]:
    """``{param: per-row gradient}`` of ``layer`` from its recorded ``activations`` (a list) and ``backprops``."""
    params = list(layer.parameters())
    if not hasattr(layer, "ft_compute_sample_grad"):
        prepare_layer(layer)
    x = activations[0]
    if x.is_floating_point() and x.dtype != backprops.dtype:
        x = x.to(backprops.dtype)
    compute: Callable[..., tuple[Tensor, ...]] = getattr(layer, "ft_compute_sample_grad")
    return dict(zip(params, compute(tuple(params), x, backprops), strict=True))
