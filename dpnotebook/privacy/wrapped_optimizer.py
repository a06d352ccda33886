"""``WrappedOptimizer``: an optimizer whose parameters and state are another optimizer's.

A DP optimizer changes only what ``step`` does to the gradients; everything
else (``param_groups``, ``state``, ``defaults``, ``state_dict``, learning-rate
schedulers, any attribute of a custom optimizer) must stay the wrapped
optimizer's, so that code written for the plain optimizer keeps working and a
checkpoint of either is the same file. This base class forwards all of it to
``original_optimizer``; :class:`~dpnotebook.privacy.optimizer.DPOptimizer` builds on it.

>>> import torch
>>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
>>> wrapped = WrappedOptimizer(sgd)
>>> wrapped.param_groups is sgd.param_groups, wrapped.defaults["momentum"]
(True, 0.9)
>>> wrapped.param_groups[0]["lr"] = 0.05             # a scheduler's write reaches the wrapped optimizer
>>> sgd.param_groups[0]["lr"]
0.05
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer

__all__ = ["WrappedOptimizer"]


class WrappedOptimizer(Optimizer):
    """Forwards ``param_groups``, ``state``, ``defaults``, ``state_dict`` and unknown attributes to ``optimizer``.

    ``Optimizer.__init__`` is not called: the wrapper keeps no state of its own.

    Args:
        optimizer: any ``torch.optim.Optimizer``.

    Attributes:
        original_optimizer: the wrapped optimizer.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.original_optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        if name == "original_optimizer":  # not set yet: do not recurse
            raise AttributeError(name)
        return getattr(self.original_optimizer, name)

    def state_dict(self) -> dict[str, Any]:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.original_optimizer.add_param_group(param_group)

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters of all param groups, in order."""
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]
