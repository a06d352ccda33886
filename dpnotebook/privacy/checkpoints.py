"""Checkpoints of a private run: the model, the optimizer, the accountant and the schedulers, in Opacus' format.

:meth:`~dpnotebook.privacy.engine.PrivacyEngine.save_checkpoint` and
:meth:`~dpnotebook.privacy.engine.PrivacyEngine.load_checkpoint` call these. The
keys are Opacus': ``module_state_dict`` (of the plain model, so it loads into it
without dpnotebook), ``optimizer_state_dict``, ``privacy_accountant_state_dict``,
``noise_scheduler_state_dict``, ``grad_clip_scheduler_state_dict``, and the
user's own entries. A checkpoint Opacus wrote (its module keys carry the
wrapper's ``_module.`` prefix) loads too.

>>> import os, tempfile, torch
>>> from torch import nn
>>> from dpnotebook.privacy._accounting import create_accountant
>>> model, acc = nn.Linear(2, 1), create_accountant("rdp")
>>> acc.step(noise_multiplier=1.0, sample_rate=0.1)
>>> path = os.path.join(tempfile.mkdtemp(), "run.pt")
>>> save_checkpoint(path, model, acc, checkpoint_dict={"epoch": 3})
>>> fresh = create_accountant("rdp")
>>> load_checkpoint(path, nn.Linear(2, 1), fresh), len(fresh)
({'epoch': 3}, 1)
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

__all__ = ["save_checkpoint", "load_checkpoint", "strip_wrapper_prefix", "scheduler_entries", "load_schedulers"]


def save_checkpoint(
    path: str | os.PathLike,
    module: nn.Module,
    accountant: Any,
    *,
    optimizer: Any = None,
    checkpoint_dict: dict[str, Any] | None = None,
    noise_scheduler: Any = None,
    grad_clip_scheduler: Any = None,
    module_state_dict_kwargs: dict[str, Any] | None = None,
    torch_save_kwargs: dict[str, Any] | None = None,
) -> None:
    """Write ``module``'s (the plain model's) state, the accountant's, and what else is given, to ``path``."""
    state = dict(checkpoint_dict or {})
    state["module_state_dict"] = module.state_dict(**(module_state_dict_kwargs or {}))
    state.update(scheduler_entries(noise_scheduler, grad_clip_scheduler))
    state["privacy_accountant_state_dict"] = accountant.state_dict()
    if optimizer is not None:
        state["optimizer_state_dict"] = optimizer.state_dict()
    torch.save(state, path, **(torch_save_kwargs or {}))


def load_checkpoint(
    path: str | os.PathLike,
    module: nn.Module,
    accountant: Any,
    *,
    optimizer: Any = None,
    map_location: Any = None,
    noise_scheduler: Any = None,
    grad_clip_scheduler: Any = None,
    module_load_dict_kwargs: dict[str, Any] | None = None,
    torch_load_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint into ``module`` (the plain model) and the rest; return the user's own entries."""
    load_kwargs = {"map_location": map_location, "weights_only": True, **(torch_load_kwargs or {})}
    state = torch.load(path, **load_kwargs)
    module.load_state_dict(
        strip_wrapper_prefix(state.pop("module_state_dict"), module), **(module_load_dict_kwargs or {})
    )
    load_schedulers(state, noise_scheduler, grad_clip_scheduler)
    accountant.load_state_dict(state.pop("privacy_accountant_state_dict"))
    optimizer_state = state.pop("optimizer_state_dict", None)
    if optimizer is not None and optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    return state


def strip_wrapper_prefix(state: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """``state`` without the ``_module.`` prefix that an Opacus checkpoint's keys carry, when ``module`` has none.

    >>> from torch import nn
    >>> sorted(strip_wrapper_prefix({"_module.weight": 1, "_module.bias": 2}, nn.Linear(1, 1)))
    ['bias', 'weight']
    """
    own = module.state_dict().keys()
    if state and not (state.keys() & own) and all(k.startswith("_module.") for k in state):
        return {k[len("_module.") :]: v for k, v in state.items()}
    return state


def scheduler_entries(noise_scheduler: Any, grad_clip_scheduler: Any) -> dict[str, Any]:
    """The checkpoint entries Opacus writes for the schedulers given."""
    entries = {}
    if noise_scheduler is not None:
        entries["noise_scheduler_state_dict"] = noise_scheduler.state_dict()
    if grad_clip_scheduler is not None:
        entries["grad_clip_scheduler_state_dict"] = grad_clip_scheduler.state_dict()
    return entries


def load_schedulers(state: dict[str, Any], noise_scheduler: Any, grad_clip_scheduler: Any) -> None:
    """Restore (and remove from ``state``) the scheduler entries of a checkpoint."""
    for key, scheduler in (
        ("noise_scheduler_state_dict", noise_scheduler),
        ("grad_clip_scheduler_state_dict", grad_clip_scheduler),
    ):
        entry = state.pop(key, None)
        if scheduler is not None and entry:
            scheduler.load_state_dict(entry)
