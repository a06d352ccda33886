"""Which layers per-sample gradients can be computed for, and how to fix the rest.

A check looks at one submodule and returns a :class:`Problem` or ``None``.
Checks live in one list, so a new rule is one decorated function.

>>> from torch import nn
>>> from dpnotebook.validation import validate
>>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
>>> [p.path for p in validate(model)]
['model.1']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from dpnotebook.errors import UnsupportedModuleError

__all__ = ["Problem", "validate", "register_check", "raise_if_problems"]


@dataclass(frozen=True)
class Problem:
    """One submodule that cannot be used as it is.

    Attributes:
        path: where it sits, e.g. ``"model.features.3"``.
        module_type: its class name, e.g. ``"BatchNorm2d"``.
        why: what goes wrong with per-sample gradients.
        fix: what to do instead.
    """

    path: str
    module_type: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} ({self.module_type}): {self.why} Fix: {self.fix}"


Check = Callable[[nn.Module], "tuple[str, str] | None"]
_CHECKS: list[Check] = []


def register_check(fn: Check) -> Check:
    """Add a check ``fn(module) -> (why, fix) | None`` run on every submodule."""
    _CHECKS.append(fn)
    return fn


@register_check
def _batch_norm(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return (
            "batch normalisation mixes the samples of a batch (each output depends on the "
            "batch statistics), so a sample's gradient is not its own.",
            "replace it with GroupNorm: dpnotebook.fix(model) does it for you.",
        )
    return None


@register_check
def _instance_norm_running_stats(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        return (
            "track_running_stats=True averages statistics over the samples of every batch "
            "into buffers that the model keeps.",
            "construct it with track_running_stats=False (dpnotebook.fix(model) does it).",
        )
    return None


@register_check
def _embedding_freq_scaling(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.scale_grad_by_freq:
        return (
            "scale_grad_by_freq=True divides each gradient by how often a word occurs in the "
            "whole batch, which mixes the samples.",
            "construct it with scale_grad_by_freq=False.",
        )
    return None


def validate(model: nn.Module, *, root: str = "model") -> list[Problem]:
    """Every problem in ``model``, in module order (an empty list when all is well).

    Args:
        model: the module to inspect; it is not changed.
        root: the name that paths start with.
    """
    problems = []
    for name, sub in model.named_modules():
        for check in _CHECKS:
            found = check(sub)
            if found is not None:
                path = f"{root}.{name}" if name else root
                problems.append(Problem(path, type(sub).__name__, *found))
    return problems


def raise_if_problems(problems: list[Problem]) -> None:
    """Raise one :class:`UnsupportedModuleError` that lists every problem."""
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise UnsupportedModuleError(
            f"{len(problems)} submodule(s) cannot be used with per-sample gradients:\n{lines}\n"
            "Call dpnotebook.validate(model) to list them, or pass strict=False to wrap anyway "
            "(their per-sample gradients would then be wrong).",
            problems,
        )
