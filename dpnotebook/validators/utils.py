"""Opacus' ``register_module_validator`` and ``register_module_fixer``, over dpnotebook's check and fixer registries.

A validator ``fn(module) -> [errors]`` becomes a check of :func:`dpnotebook.validate`
(every mode; as in Opacus, only on layers with trainable parameters of their own); a fixer ``fn(module, **kwargs) -> replacement`` becomes a fixer of
:func:`dpnotebook.fix`. As in dpnotebook, a fixer runs on the layers a check flags:
register a validator for the type too.

>>> import torch
>>> from torch import nn
>>> import dpnotebook
>>> class Scale(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.s = nn.Parameter(torch.ones(1))
...     def forward(self, x):
...         return self.s * x
>>> @register_module_validator(Scale)
... def no_scale(module):
...     return [ValueError("Scale is not allowed")]
>>> @register_module_fixer(Scale)
... def drop_scale(module, **kwargs):
...     return nn.Identity()
>>> [p.module_type for p in dpnotebook.validate(nn.Sequential(Scale()))]
['Scale']
>>> dpnotebook.fix(nn.Sequential(Scale()))[0]
Identity()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from dpnotebook.fixers import register_fixer
from dpnotebook.validation import register_check
from dpnotebook.validators.module_validator import ModuleValidator

__all__ = ["register_module_validator", "register_module_fixer"]


def _types(target: type | Sequence[type]) -> list[type]:
    return list(target) if isinstance(target, Sequence) else [target]


def register_module_validator(
    target_class_or_classes: type | Sequence[type], validator_class: type[ModuleValidator] = ModuleValidator
) -> Callable:
    """Register ``fn(module) -> [errors]`` for these layer types (Opacus' decorator)."""

    def decorator(fn: Callable[[nn.Module], list]) -> Callable[[nn.Module], list]:
        types = tuple(_types(target_class_or_classes))
        for t in types:
            validator_class.VALIDATORS[t] = fn

        def check(module: nn.Module) -> tuple[str, str] | None:
            if type(module) not in types or validator_class.VALIDATORS.get(type(module)) is not fn:
                return None
            if not any(p.requires_grad for p in module.parameters(recurse=False)):
                return None  # as in Opacus: validators run on layers with trainable parameters
            errors = fn(module)
            if not errors:
                return None
            return " ".join(str(e) for e in errors), f"see the validator {fn.__name__!r} registered for it."

        register_check(check)
        return fn

    return decorator


def register_module_fixer(
    target_class_or_classes: type | Sequence[type], validator_class: type[ModuleValidator] = ModuleValidator
) -> Callable:
    """Register ``fn(module, **kwargs) -> replacement`` for these layer types (Opacus' decorator)."""

    def decorator(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        types = _types(target_class_or_classes)
        for t in types:
            validator_class.FIXERS[t] = fn
        register_fixer(*types)(fn)
        return fn

    return decorator
