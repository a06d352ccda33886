"""Opacus' ``ModuleValidator``: thin names over :func:`dpnotebook.validate` and :func:`dpnotebook.fix`.

``dpnotebook.validate(model)`` returns a list of :class:`~dpnotebook.validation.Problem`
(path, type, why, fix); ``ModuleValidator.validate`` returns the same findings as
Opacus returns them, a list of exceptions, and raises them all at once with
``strict=True``. As in Opacus, a model in eval mode is flagged (make it
``model.train()`` before making it private), and ``fix`` replaces BatchNorm by
``GroupNorm(gcd(32, C), C)``, Opacus' group count (``dpnotebook.fix`` keeps at
least two channels per group instead, see :func:`~dpnotebook.fixers.group_count`).

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

import math
from collections.abc import Callable
from typing import Any

from torch import nn

from dpnotebook.errors import UnsupportedModuleError
from dpnotebook.fixers import fix
from dpnotebook.validation import Problem, validate
from dpnotebook.validators.errors import IllegalModuleConfigurationError, ShouldReplaceModuleError

__all__ = ["ModuleValidator", "opacus_group_count"]


def opacus_group_count(channels: int) -> int:
    """Opacus' GroupNorm group count for a replaced BatchNorm: ``gcd(32, channels)``.

    >>> [opacus_group_count(c) for c in (3, 16, 48, 64)]
    [1, 16, 16, 32]
    """
    return math.gcd(32, channels)


class ModuleValidator:
    """Opacus' validation namespace (class methods only).

    Attributes:
        VALIDATORS: ``{layer type: fn(module) -> [errors]}`` registered with
            :func:`~dpnotebook.validators.register_module_validator` (run by
            :func:`dpnotebook.validate` too).
        FIXERS: ``{layer type: fn(module, **kwargs) -> replacement}`` registered with
            :func:`~dpnotebook.validators.register_module_fixer` (run by :func:`dpnotebook.fix` too).
    """

    VALIDATORS: dict[type, Callable[..., list]] = {}
    FIXERS: dict[type, Callable[..., nn.Module]] = {}

    @classmethod
    def validate(cls, module: nn.Module, *, strict: bool = False) -> list[UnsupportedModuleError]:
        """One exception per problem :func:`dpnotebook.validate` finds (plus eval mode); raise them if ``strict``."""
        errors: list[UnsupportedModuleError] = []
        if not module.training:
            errors.append(
                IllegalModuleConfigurationError(
                    "Model needs to be in training mode: call model.train() before making it private."
                )
            )
        errors += [ShouldReplaceModuleError(str(p), [p]) for p in validate(module)]
        if strict and errors:
            problems: list[Problem] = [p for e in errors for p in e.problems]
            raise UnsupportedModuleError(
                f"{len(errors)} problem(s) found:\n" + "\n".join(f"  - {e}" for e in errors), problems
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
            kwargs["num_groups"] = opacus_group_count
            kwargs.pop("replace_bn_with_in", None)
        return fix(module, **kwargs)

    @classmethod
    def fix_and_validate(cls, module: nn.Module, **kwargs: Any) -> nn.Module:
        """:meth:`fix`, then :meth:`validate` with ``strict=True``."""
        fixed = cls.fix(module, **kwargs)
        cls.validate(fixed, strict=True)
        return fixed
