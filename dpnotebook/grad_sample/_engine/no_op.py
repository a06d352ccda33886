"""Opacus' ``"no_op"`` mode, and :class:`OuterWrapper`, the base of the wrappers without hooks engine.

``"no_op"`` computes nothing; you set ``p.grad_sample``. It is for training loops that compute
per-sample gradients themselves (Opacus' cifar10 example does it with ``torch.func.vmap``) and hand
them to the DP optimizer, which clips, noises and accounts them as any mode's, and still checks
that each step clips as many per-sample gradients as the Poisson batch had examples; that they
*are* per-sample gradients is up to you. The mode is registered but not listed by
:func:`dpnotebook.available_modes` (the audit grid and the capability table run the modes that
compute). The ``"ew"`` and ``"no_op"`` wrappers both clear ``p.grad_sample`` with the gradients,
hand the model back unchanged, and pass unknown attributes through to it.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> model = wrap_model(nn.Linear(3, 1), "no_op")
>>> model(torch.randn(4, 3)).sum().backward()
>>> getattr(model.weight, "grad_sample", None) is None, model.weight.grad.shape
(True, torch.Size([1, 3]))
>>> model.out_features                       # the model's attribute, through the wrapper
1
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.grad_sample._engine.hooks import check_k, check_loss_reduction
from dpnotebook.modes import register_mode
from dpnotebook.validation import Problem, raise_if_problems, validate


class OuterWrapper(nn.Module):
    """Holds ``module`` as ``_module``; ``zero_grad`` clears ``grad_sample`` too; attributes pass through.

    Args:
        module: the model (not copied; :meth:`to_standard_module` returns it).
    """

    grad_sample_mode: str  # which checks of dpnotebook.validate apply

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module

    @classmethod
    def validate(cls, module: nn.Module, *, strict: bool = False) -> list[Problem]:
        """Problems that stop per-sample gradients in this mode; raise them all at once if ``strict``."""
        problems = validate(module, mode=cls.grad_sample_mode)
        if strict:
            raise_if_problems(problems)
        return problems

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


@register_mode("no_op", listed=False)
class GradSampleModuleNoOp(OuterWrapper):
    """Wraps ``module`` without hooks (same arguments as :class:`~dpnotebook.grad_sample._engine.hooks.GradSampleModule`).

    Layers that mix samples (BatchNorm, ...) are still refused when ``strict``.
    """

    grad_sample_mode = "no_op"

    def __init__(
        self,
        module: nn.Module,
        *,
        batch_first: bool = True,
        loss_reduction: str = "mean",
        strict: bool = True,
        K: int = 1,
        **ignored: Any,
    ) -> None:
        if strict:
            raise_if_problems(self.validate(module))
        super().__init__(module)
        self.batch_first = batch_first
        self.loss_reduction = check_loss_reduction(loss_reduction)
        self.K = check_k(K)
        self.hooks_enabled = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    def add_hooks(self) -> None:
        """Nothing to add."""

    def remove_hooks(self) -> None:
        """Nothing to remove."""

    def enable_hooks(self) -> None:
        """No hooks to enable."""

    def disable_hooks(self) -> None:
        """No hooks to disable."""

    def allow_grad_accumulation(self) -> None:
        """Accumulation is yours to manage."""

    def forbid_grad_accumulation(self) -> None:
        """Accumulation is yours to manage."""
