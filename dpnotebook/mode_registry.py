"""The registry of grad-sample mode names, and which checks of :func:`dpnotebook.validate` each one runs.

:mod:`dpnotebook.modes` registers each mode's wrapper here; :mod:`dpnotebook.validation`
reads the names from here too, so both know the same modes and neither imports the other.
A mode that builds on another declares it: ghost mode runs hooks mode's checks.

>>> from dpnotebook.mode_registry import available_modes, validates_as
>>> "ghost" in available_modes(), validates_as("ghost")
(True, 'hooks')
>>> validates_as("hook")
Traceback (most recent call last):
...
ValueError: mode='hook' is unknown; choose one of ['ew', 'functorch', 'ghost', 'hooks'].
"""

from __future__ import annotations

from typing import Callable

from torch import nn

__all__ = ["register_mode", "available_modes", "factory", "validates_as"]

ModeFactory = Callable[..., nn.Module]
_MODES: dict[str, ModeFactory] = {}
_VALIDATES_AS: dict[str, str] = {}
_UNLISTED: set[str] = set()


def register_mode(
    name: str, *, validates_as: str | None = None, listed: bool = True
) -> Callable[[ModeFactory], ModeFactory]:
    """Register ``factory(module, **kwargs) -> wrapper`` under ``name``.

    Args:
        name: the mode's name, as passed to ``wrap_model`` and ``validate``.
        validates_as: the mode whose checks apply to it (default: ``name`` itself).
        listed: whether :func:`available_modes` lists it (the audit grid, the capability
            table and the comparisons run every listed mode). Opacus' ``"no_op"``, which
            computes nothing, is not listed.
    """

    def decorator(fn: ModeFactory) -> ModeFactory:
        _MODES[name] = fn
        _VALIDATES_AS[name] = validates_as or name
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
