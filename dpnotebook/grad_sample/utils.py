"""``opacus.grad_sample.utils`` under dpnotebook: mode-registry look-ups with Opacus' names and signatures.

>>> get_gsm_class("hooks").__name__, get_gsm_class("ghost").__name__
('GradSampleModule', 'GhostGradSampleModule')
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.modes import mode_class
from dpnotebook.modes import wrap_model as _wrap_in_mode

__all__ = ["wrap_model", "get_gsm_class", "register_grad_sampler"]


def wrap_model(model: nn.Module, grad_sample_mode: str, *args: Any, **kwargs: Any) -> nn.Module:
    """Opacus' ``wrap_model(model, grad_sample_mode, batch_first=, loss_reduction=)``: :func:`dpnotebook.wrap_model`.

    Raises:
        TypeError: positional arguments after ``grad_sample_mode`` (give them by keyword).
    """
    if args:
        raise TypeError(
            f"wrap_model(model, {grad_sample_mode!r}, {', '.join(map(repr, args))}): give batch_first=, "
            "loss_reduction= ... by keyword."
        )
    return _wrap_in_mode(model, grad_sample_mode, **kwargs)


def get_gsm_class(grad_sample_mode: str) -> type[nn.Module]:
    """The wrapper class of ``grad_sample_mode`` (a ``ValueError`` names the registered modes)."""
    return mode_class(grad_sample_mode)
