"""The registry of grad-sample modes: per mode, its wrapper, its DP optimizer and the checks it validates as.

:mod:`dpnotebook.modes` registers each mode's wrapper here; :mod:`dpnotebook.validation`,
the :class:`~dpnotebook.privacy.PrivacyEngine`, the benchmarks and the capability table
read the modes from here, so all know the same modes and none imports another.
A mode that builds on another declares it: ghost mode runs hooks mode's checks. Its optimizer
is named by import path (``"package.module:Class"``) and imported on first use, so that this
registry, which the per-sample-gradient code reads, never imports the privacy code.

>>> from dpnotebook.mode_registry import available_modes, optimizer_class, validates_as
>>> "ghost" in available_modes(), validates_as("ghost")
(True, 'hooks')
>>> optimizer_class("ghost").__name__, optimizer_class("hooks").__name__
('GhostDPOptimizer', 'DPOptimizer')
>>> validates_as("hook")
Traceback (most recent call last):
...
ValueError: mode='hook' is unknown; choose one of ['ew', 'functorch', 'ghost', 'hooks'].
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from torch import nn

__all__ = ["register_mode", "available_modes", "factory", "validates_as", "optimizer_class"]

ModeFactory = Callable[..., nn.Module]


class Unwrappable(Protocol):
    """What every mode's wrapper has beside being an ``nn.Module`` (a factory's type can only say the latter)."""

    def to_standard_module(self) -> nn.Module:
        """Remove the wrapper's hooks and return the wrapped module."""
        ...


_MODES: dict[str, ModeFactory] = {}
_VALIDATES_AS: dict[str, str] = {}
_UNLISTED: set[str] = set()
_OPTIMIZERS: dict[str, str] = {}
#: The optimizer of a mode that names none: clip ``p.grad_sample``, add noise.
DEFAULT_OPTIMIZER = "dpnotebook.privacy._optimizer:DPOptimizer"


def register_mode(
    name: str, *, validates_as: str | None = None, listed: bool = True, optimizer: str = DEFAULT_OPTIMIZER
) -> Callable[[ModeFactory], ModeFactory]:
    """Register ``factory(module, **kwargs) -> wrapper`` under ``name``.

    Args:
        name: the mode's name, as passed to ``wrap_model`` and ``validate``.
        validates_as: the mode whose checks apply to it (default: ``name`` itself).
        listed: whether :func:`available_modes` lists it (the audit grid, the capability
            table and the comparisons run every listed mode). Opacus' ``"no_op"``, which
            computes nothing, is not listed.
        optimizer: ``"package.module:Class"``, the DP optimizer that ``make_private`` builds
            for a model wrapped in this mode.
    """

    def decorator(fn: ModeFactory) -> ModeFactory:
        _MODES[name] = fn
        _VALIDATES_AS[name] = validates_as or name
        _OPTIMIZERS[name] = optimizer
        if not listed:
            _UNLISTED.add(name)
        return fn

    return decorator


def available_modes() -> list[str]:
    """The registered mode names that compute per-sample gradients, sorted."""
    return sorted(set(_MODES) - _UNLISTED)


def _known(name: str, argument: str) -> str:
    if name not in _MODES:
        raise ValueError(f"{argument}={name!r} is unknown; choose one of {available_modes()}.")
    return name


def factory(name: str, argument: str = "grad_sample_mode") -> ModeFactory:
    """The wrapper factory registered under ``name``; a ``ValueError`` names the registered ones."""
    return _MODES[_known(name, argument)]


def validates_as(name: str, argument: str = "mode") -> str:
    """The mode whose checks :func:`dpnotebook.validate` runs for mode ``name``."""
    return _VALIDATES_AS[_known(name, argument)]


def optimizer_class(name: str, argument: str = "grad_sample_mode") -> type:
    """The DP optimizer class of mode ``name`` (imported on first use)."""
    module, _, cls = _OPTIMIZERS[_known(name, argument)].partition(":")
    return getattr(importlib.import_module(module), cls)
