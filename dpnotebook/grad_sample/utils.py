"""``opacus.grad_sample.utils`` under dpnotebook: ``wrap_model``, ``get_gsm_class``, ``register_grad_sampler``.

``wrap_model`` is :func:`dpnotebook.modes.wrap_model` (Opacus' ``batch_first`` and
``loss_reduction`` keywords mean the same); ``get_gsm_class`` gives the class the mode
registry holds for that mode. Opacus' ``register_norm_sampler`` takes a
function returning norms; dpnotebook's (:mod:`~dpnotebook.grad_sample._contracts`)
takes a group maker, so it is not aliased here.

>>> from torch import nn
>>> get_gsm_class("hooks").__name__, get_gsm_class("ghost").__name__
('GradSampleModule', 'GhostGradSampleModule')
>>> type(wrap_model(nn.Linear(2, 2), grad_sample_mode="ew", batch_first=True)).__name__
'GradSampleModuleExpandedWeights'
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.modes import mode_class
from dpnotebook.modes import wrap_model as _wrap_in_mode


def wrap_model(model: nn.Module, grad_sample_mode: str, *args: Any, **kwargs: Any) -> nn.Module:
    """Opacus' ``wrap_model(model, grad_sample_mode, batch_first=..., loss_reduction=...)``.

    Raises:
        TypeError: positional arguments after ``grad_sample_mode`` (give them by keyword).
    """
    if args:
        raise TypeError(
            f"wrap_model(model, {grad_sample_mode!r}, {', '.join(map(repr, args))}): give batch_first=, "
            "loss_reduction= ... by keyword."
        )
    return _wrap_in_mode(model, grad_sample_mode, **kwargs)


def get_gsm_class(grad_sample_mode: str) -> type:
    """The wrapper class of ``grad_sample_mode`` (a ``ValueError`` names the registered modes)."""
    return mode_class(grad_sample_mode)


__all__ = ["wrap_model", "get_gsm_class", "register_grad_sampler"]
