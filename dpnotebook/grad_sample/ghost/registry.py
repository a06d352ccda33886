"""The registry of norm samplers: how ghost mode handles each layer type.

A *norm sampler* tells ghost mode how to get a layer's per-sample gradient
norms and its clipped sum without the hooks engine: a group maker (see
:class:`~dpnotebook.grad_sample.ghost.groups.GhostHandler`) registered for the
layer's type, as a grad sampler is registered for the hooks engine
(:func:`~dpnotebook.grad_sample._registry.register_grad_sampler`). The built-in
ones live beside the layers they handle (:mod:`~dpnotebook.grad_sample.samplers.linear_norm`,
:mod:`~dpnotebook.grad_sample.samplers.conv_norm`, :mod:`~dpnotebook.grad_sample.samplers.rnn_norm`,
:mod:`~dpnotebook.grad_sample.samplers.materialised_norm`). A layer type with none is left
to the hooks engine inside ghost mode (its registered grad sampler, or ``torch.func``).

Your own layer takes part the simplest way by materialising: its registered grad
sampler forms the per-sample gradients, and ghost mode takes their norms and
weighted sum (:func:`~dpnotebook.grad_sample.ghost.groups.materialise`):

>>> from torch import nn
>>> from dpnotebook.grad_sample.ghost.groups import materialise
>>> class Scale(nn.Module):                       # y = x * w, one weight per feature
...     def __init__(self, d):
...         super().__init__()
...         self.w = nn.Parameter(torch.ones(d))
...     def forward(self, x):
...         return x * self.w
>>> from dpnotebook import register_grad_sampler
>>> @register_grad_sampler(Scale)
... def scale_sampler(layer, activations, backprops, K):
...     per_row = activations[0] * backprops                      # [rows, d]
...     return {layer.w: per_row.view(-1, K, per_row.shape[-1]).mean(1)}
>>> _ = register_norm_sampler(Scale, materialises=True)(materialise)
>>> ghost_handler(Scale(3)).materialises
True
>>> unregister_norm_sampler(Scale); ghost_handler(Scale(3)) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import torch  # noqa: F401  (used by the doctest)
from torch import nn

from dpnotebook.grad_sample._registry import load_optional_samplers
from dpnotebook.grad_sample.ghost.groups import GhostCall, GhostGroup, GhostHandler

_NORM_SAMPLERS: dict[type, GhostHandler] = {}

#: The layer types a norm sampler is registered for (their closest common base class).
L = TypeVar("L", bound=nn.Module)
#: A group maker, ``make_group(module, calls, K, scratch)`` (its module typed as one of its layer types).
M = TypeVar("M", bound=Callable[..., GhostGroup])


def register_norm_sampler(
    *layer_types: type[L],
    outside: tuple[str, ...] = (),
    materialises: bool = False,
    settles: Callable[[L, GhostCall, int], bool] | None = None,
) -> Callable[[M], M]:
    """Decorator: ghost mode handles ``layer_types`` with the decorated group maker.

    Args:
        *layer_types: ``nn.Module`` subclasses (a subclass that overrides ``forward`` is not matched).
        outside: names of parameters the layer's owner also uses outside the layer's forward.
        materialises: the maker's groups hold per-sample gradients, made call by call.
        settles: ``settles(module, call, K)``: whether a call is settled as soon as its backprops arrive.

    Raises:
        TypeError: a layer type that is not an ``nn.Module`` subclass.
    """
    for t in layer_types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"register_norm_sampler({t!r}): layer types must be nn.Module subclasses.")

    def decorator(make_group: M) -> M:
        # ghost_handler gives the handler only to modules of layer_types, so it may take them as L
        settle = cast("Callable[[nn.Module, GhostCall, int], bool] | None", settles)
        for t in layer_types:
            _NORM_SAMPLERS[t] = GhostHandler(make_group, outside=outside, materialises=materialises, settles=settle)
        return make_group

    return decorator


def unregister_norm_sampler(*layer_types: type) -> None:
    """Forget the norm samplers of ``layer_types`` (ghost mode then leaves them to the hooks engine)."""
    for t in layer_types:
        _NORM_SAMPLERS.pop(t, None)


def ghost_handler(module: nn.Module) -> GhostHandler | None:
    """The :class:`~dpnotebook.grad_sample.ghost.groups.GhostHandler` of ``module``'s type, or ``None``.

    ``None``: ghost mode leaves the layer to the hooks engine (its registered
    sampler, or torch.func). A subclass that overrides ``forward`` is not matched.

    >>> import dpnotebook.grad_sample.ghost.wrapper  # the built-in norm samplers
    >>> ghost_handler(nn.Conv2d(1, 2, 3)).materialises, ghost_handler(nn.Linear(2, 2)).materialises
    (True, False)
    >>> ghost_handler(nn.BatchNorm1d(3)) is None
    True
    """
    load_optional_samplers()
    if isinstance(module, nn.Embedding) and module.max_norm is not None:
        return None  # max_norm renormalises the weight in place during the forward
    for cls in type(module).__mro__:
        # registered types are nn.Module subclasses (register_norm_sampler checks)
        if cls in _NORM_SAMPLERS and (
            cls is type(module) or type(module).forward is cast(type[nn.Module], cls).forward
        ):
            return _NORM_SAMPLERS[cls]
    return None


def norm_sampler_types() -> list[type]:
    """The layer types that have a norm sampler."""
    return list(_NORM_SAMPLERS)


__all__ = ["register_norm_sampler", "unregister_norm_sampler", "ghost_handler", "norm_sampler_types"]
