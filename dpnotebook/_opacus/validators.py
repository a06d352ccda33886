"""Opacus' validation names (``opacus.validators``, ``.errors``, ``.module_validator``, ``.utils``).

``ModuleValidator`` is a namespace over :func:`dpnotebook.validate` and :func:`dpnotebook.fix` (eval mode
is flagged; BatchNorm becomes ``GroupNorm(gcd(32, C), C)``); the exceptions subclass
:class:`dpnotebook.errors.UnsupportedModuleError`. What differs is in ``docs/migration-from-opacus.md``.

>>> from torch import nn
>>> model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.BatchNorm2d(16))
>>> ModuleValidator.is_valid(model)
False
>>> fixed = ModuleValidator.fix(model)
>>> fixed[1].num_groups, ModuleValidator.is_valid(fixed)
(16, True)
>>> ModuleValidator.fix(model, num_groups=4)[1].num_groups
4
>>> [type(e).__name__ for e in ModuleValidator.validate(fixed.eval())]
['IllegalModuleConfigurationError']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from dpnotebook.errors import UnsupportedModuleError
from dpnotebook.fixers import fix, register_fixer
from dpnotebook.privacy._engine import gcd_group_count
from dpnotebook.validation import register_check, validate

__all__ = [
    "UnsupportedError",
    "UnsupportedModuleError",
    "UnsupportableModuleError",
    "NotYetSupportedModuleError",
    "ShouldReplaceModuleError",
    "IllegalModuleConfigurationError",
    "ModuleValidator",
    "register_module_validator",
    "register_module_fixer",
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


class ModuleValidator:
    """Opacus' validation namespace (class methods only).

    Attributes:
        VALIDATORS: ``{layer type: fn(module) -> [errors]}``, from :func:`register_module_validator`.
        FIXERS: ``{layer type: fn(module, **kwargs) -> replacement}``, from :func:`register_module_fixer`.
    """

    VALIDATORS: dict[type, Callable[..., list[Any]]] = {}
    FIXERS: dict[type, Callable[..., nn.Module]] = {}

    @classmethod
    def validate(cls, module: nn.Module, *, strict: bool = False) -> list[UnsupportedModuleError]:
        """One exception per problem :func:`dpnotebook.validate` finds (plus eval mode); raise them if ``strict``."""
        errors: list[UnsupportedModuleError] = [ShouldReplaceModuleError(str(p), [p]) for p in validate(module)]
        if not module.training:
            why = "Model needs to be in training mode: call model.train() before making it private."
            errors.insert(0, IllegalModuleConfigurationError(why))
        if strict and errors:
            found = "\n".join(f"  - {e}" for e in errors)
            raise UnsupportedModuleError(
                f"{len(errors)} problem(s) found:\n{found}", [p for e in errors for p in e.problems]
            )
        return errors

    @classmethod
    def is_valid(cls, module: nn.Module) -> bool:
        """``True`` when :meth:`validate` finds nothing."""
        return not cls.validate(module, strict=False)

    @classmethod
    def fix(cls, module: nn.Module, **kwargs: Any) -> nn.Module:
        """:func:`dpnotebook.fix` with Opacus' options and group count (a copy; ``module`` is not changed).

        Args:
            module: the model.
            **kwargs: ``num_groups=`` (BatchNorm -> GroupNorm with that many groups; default
                ``gcd(32, C)``) or ``replace_bn_with_in=True`` (BatchNorm -> InstanceNorm).
        """
        if kwargs.get("num_groups") is None and not kwargs.get("replace_bn_with_in"):
            kwargs["num_groups"] = gcd_group_count
            kwargs.pop("replace_bn_with_in", None)
        return fix(module, **kwargs)

    @classmethod
    def fix_and_validate(cls, module: nn.Module, **kwargs: Any) -> nn.Module:
        """:meth:`fix`, then :meth:`validate` with ``strict=True``."""
        fixed = cls.fix(module, **kwargs)
        cls.validate(fixed, strict=True)
        return fixed


def _types(target: type | Sequence[type]) -> tuple[type, ...]:
    return tuple(target) if isinstance(target, Sequence) else (target,)


def register_module_validator(
    target_class_or_classes: type | Sequence[type], validator_class: type[ModuleValidator] = ModuleValidator
) -> Callable[..., Any]:
    """Register ``fn(module) -> [errors]`` for these layer types (Opacus' decorator)."""

    def decorator(fn: Callable[[nn.Module], list[Any]]) -> Callable[[nn.Module], list[Any]]:
        types = _types(target_class_or_classes)
        validator_class.VALIDATORS.update(dict.fromkeys(types, fn))

        def check(module: nn.Module) -> tuple[str, str] | None:
            mine = type(module) in types and validator_class.VALIDATORS.get(type(module)) is fn
            # as in Opacus: validators run on layers with trainable parameters of their own
            errors = fn(module) if mine and any(p.requires_grad for p in module.parameters(recurse=False)) else []
            if not errors:
                return None
            return " ".join(map(str, errors)), f"see the validator {fn.__name__!r} registered for it."

        register_check(check)
        return fn

    return decorator


def register_module_fixer(
    target_class_or_classes: type | Sequence[type], validator_class: type[ModuleValidator] = ModuleValidator
) -> Callable[..., Any]:
    """Register ``fn(module, **kwargs) -> replacement`` for these layer types (Opacus' decorator)."""

    def decorator(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        types = _types(target_class_or_classes)
        validator_class.FIXERS.update(dict.fromkeys(types, fn))
        return register_fixer(*types)(fn)

    return decorator
