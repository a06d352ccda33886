"""The grad-sample modes: how per-sample gradients are computed, one wrapper class each.

Each mode's wrapper class registers itself with :func:`register_mode`, so this registry imports
none of them; ``import dpnotebook`` fills it (``hooks``, ``functorch``, ``ew``, ``ghost``, and
``no_op``, which :func:`available_modes` does not list). A mode that builds on another validates as
it: ghost mode runs hooks mode's checks in :func:`dpnotebook.validate`.

>>> from torch import nn
>>> import dpnotebook
>>> type(dpnotebook.wrap_model(nn.Linear(2, 2), "functorch")).__name__
'FunctorchGradSampleModule'
>>> mode_class("ghost").__name__, validates_as("ghost")
('GhostGradSampleModule', 'hooks')
>>> dpnotebook.wrap_model(nn.Linear(2, 2), "jax")
Traceback (most recent call last):
...
ValueError: grad_sample_mode='jax' is unknown; choose one of ['ew', 'functorch', 'ghost', 'hooks'].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from torch import nn

__all__ = ["register_mode", "available_modes", "mode_class", "validates_as", "wrap_model", "Unwrappable"]

W = TypeVar("W", bound=type[nn.Module])


class Unwrappable(Protocol):
    """What every mode's wrapper has beside being an ``nn.Module``."""

    def to_standard_module(self) -> nn.Module:
        """Remove the wrapper's hooks and return the wrapped module."""
        ...


_MODES: dict[str, type[nn.Module]] = {}
_VALIDATES_AS: dict[str, str] = {}
_UNLISTED: set[str] = set()


def register_mode(name: str, *, validates_as: str | None = None, listed: bool = True) -> Callable[[W], W]:
    """Class decorator: ``cls(module, **kwargs)`` wraps a model in mode ``name``.

    Args:
        name: the mode's name, as passed to :func:`wrap_model` and :func:`dpnotebook.validate`.
        validates_as: the mode whose checks apply to it (default: ``name`` itself).
        listed: whether :func:`available_modes` lists it (``"no_op"``, which computes nothing, is not).
    """

    def decorator(cls: W) -> W:
        _MODES[name] = cls
        _VALIDATES_AS[name] = validates_as or name
        if not listed:
            _UNLISTED.add(name)
        return cls

    return decorator


def available_modes() -> list[str]:
    """The registered mode names that compute per-sample gradients, sorted."""
    return sorted(set(_MODES) - _UNLISTED)


def mode_class(name: str, argument: str = "grad_sample_mode") -> type[nn.Module]:
    """The wrapper class of mode ``name``.

    Raises:
        ValueError: ``name`` is not a registered mode (the message lists the registered ones).
    """
    if name not in _MODES:
        raise ValueError(f"{argument}={name!r} is unknown; choose one of {available_modes()}.")
    return _MODES[name]


def validates_as(name: str, argument: str = "mode") -> str:
    """The mode whose checks :func:`dpnotebook.validate` runs for mode ``name``."""
    mode_class(name, argument)
    return _VALIDATES_AS[name]


def wrap_model(module: nn.Module, grad_sample_mode: str = "hooks", **kwargs: Any) -> nn.Module:
    """Wrap ``module`` so that backward fills ``p.grad_sample``, in the chosen mode.

    Args:
        module: the model.
        grad_sample_mode: a registered mode (:func:`available_modes`).
        **kwargs: passed to the wrapper (``K``, ``batch_first``, ``loss_reduction``, ``strict``, ...).
    """
    return mode_class(grad_sample_mode)(module, **kwargs)
