"""What a wrapper that holds the model as ``_module`` (no hooks of its own on it) does alike.

The ``"ew"`` and ``"no_op"`` modes wrap a model without the hooks engine; both
clear ``p.grad_sample`` with the gradients, hand the model back unchanged, and
pass unknown attributes through to it.

>>> import torch
>>> from torch import nn
>>> wrapped = OuterWrapper(nn.Linear(2, 1))
>>> wrapped.out_features                       # the model's attribute, through the wrapper
1
>>> wrapped.weight.grad_sample = torch.zeros(3, 1, 2)
>>> wrapped.zero_grad(); wrapped.weight.grad_sample is None
True
>>> hasattr(wrapped.to_standard_module().weight, "grad_sample")
False
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["OuterWrapper"]


class OuterWrapper(nn.Module):
    """Holds ``module`` as ``_module``; ``zero_grad`` clears ``grad_sample`` too; attributes pass through.

    Args:
        module: the model (not copied; :meth:`to_standard_module` returns it).
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        for p in self._module.parameters():
            setattr(p, "grad_sample", None)  # the wrapper's attribute: torch's Parameter does not declare it

    def to_standard_module(self) -> nn.Module:
        """The model, with every ``grad_sample`` removed."""
        for p in self._module.parameters():
            if hasattr(p, "grad_sample"):
                del p.grad_sample
        return self._module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("_module"), name)
