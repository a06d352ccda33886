"""Opacus' validator exceptions (``opacus.validators.errors``), over :class:`dpnotebook.errors.UnsupportedModuleError`.

Catching any of them catches what dpnotebook raises for an unsupported model:
:class:`UnsupportedError` is the same class as ``UnsupportedModuleError``, and the
finer ones subclass it.

>>> from dpnotebook.errors import UnsupportedModuleError as Ours
>>> UnsupportedError is Ours, issubclass(ShouldReplaceModuleError, Ours), issubclass(Ours, NotImplementedError)
(True, True, True)
"""

from __future__ import annotations

from dpnotebook.errors import UnsupportedModuleError

__all__ = [
    "UnsupportedError",
    "UnsupportedModuleError",
    "UnsupportableModuleError",
    "NotYetSupportedModuleError",
    "ShouldReplaceModuleError",
    "IllegalModuleConfigurationError",
]

#: Opacus' base class; here the same class as :class:`UnsupportedModuleError`.
UnsupportedError = UnsupportedModuleError


class UnsupportableModuleError(UnsupportedModuleError):
    """A layer that cannot be made private at all."""


class NotYetSupportedModuleError(UnsupportedModuleError):
    """A layer that could be supported but is not."""


class ShouldReplaceModuleError(UnsupportedModuleError):
    """A layer that should be replaced (``ModuleValidator.fix`` does it)."""


class IllegalModuleConfigurationError(UnsupportedModuleError):
    """A model set up in a way that cannot be trained privately (e.g. in eval mode)."""
