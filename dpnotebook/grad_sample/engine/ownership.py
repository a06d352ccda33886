"""Which dpnotebook wrapper's hooks sit on a model, and removing them from copies.

Two wrappers on one model would both add to ``p.grad_sample``, silently
doubling it, so wrapping a model that another live wrapper still hooks is
refused. ``copy.deepcopy`` of a wrapped model copies its hooks too; the oracle
and the checker work on copies, so they strip them first.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn


def _owner_of(hook: Any) -> Any:
    """The GradSampleModule behind a forward hook installed by dpnotebook, else None."""
    fn = hook.func if isinstance(hook, functools.partial) else hook
    hooks = getattr(fn, "__self__", None)
    return getattr(hooks, "owner", None) if type(hooks).__name__ == "LayerHooks" else None


def wrapper_hooking(module: nn.Module) -> tuple[str, Any] | None:
    """``(submodule path, wrapper)`` of the first dpnotebook hook found in ``module``, or None."""
    for name, sub in module.named_modules():
        for hook in sub._forward_hooks.values():
            owner = _owner_of(hook)
            if owner is not None:
                return name, owner
    return None


def check_not_wrapped(module: nn.Module, root: str = "model") -> None:
    """Raise if another dpnotebook wrapper still has hooks on ``module``."""
    found = wrapper_hooking(module)
    if found is not None:
        path = f"{root}.{found[0]}" if found[0] else root
        raise ValueError(
            f"{path} already has hooks of another {type(found[1]).__name__} (K={found[1].K}); a second "
            "wrapper would count every gradient twice. Call .to_standard_module() on the first wrapper, "
            "or, to see how a model would be split without wrapping it, use "
            "dpnotebook.grad_sample.plan_units(model)."
        )


def strip_dpnotebook_hooks(module: nn.Module) -> nn.Module:
    """Remove every dpnotebook hook from ``module`` (a copy, typically) and return it."""
    for sub in module.modules():
        for key in [k for k, h in sub._forward_hooks.items() if _owner_of(h) is not None]:
            del sub._forward_hooks[key]
            sub._forward_hooks_with_kwargs.pop(key, None)
    for p in module.parameters():
        hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
        for key in [k for k, h in hooks.items() if type(getattr(h, "__self__", None)).__name__ == "GradSampleStore"]:
            del hooks[key]
        if hasattr(p, "grad_sample"):
            del p.grad_sample
    return module
