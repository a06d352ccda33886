"""Registers grad-sample mode ``"ghost"`` (:mod:`dpnotebook.grad_sample.ghost.wrapper`), imported on first use.

>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> type(wrap_model(nn.Linear(2, 2), "ghost")).__name__
'GhostGradSampleModule'
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.mode_registry import register_mode


# ghost mode builds on hooks mode; no p.grad_sample: norms and sums come from the wrapper
@register_mode("ghost", validates_as="hooks", optimizer="dpnotebook.privacy._optimizer:GhostDPOptimizer")
def _ghost(module: nn.Module, **kwargs: Any) -> nn.Module:
    from dpnotebook.grad_sample.ghost.wrapper import GhostGradSampleModule

    return GhostGradSampleModule(module, **kwargs)
