"""The ``"no_op"`` mode: a wrapper that computes nothing; you set ``p.grad_sample``.

For training loops that compute per-sample gradients themselves (with ``torch.func.vmap``, say) and
hand them to the DP optimizer, which clips, noises and accounts them as any mode's, and still checks
that each step clips as many per-sample gradients as the Poisson batch had examples; that they *are*
per-sample gradients is up to you. Not listed by :func:`dpnotebook.available_modes`.

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

from dpnotebook.grad_sample._engine.hooks import ModelWrapper
from dpnotebook.modes import register_mode


@register_mode("no_op", listed=False)
class GradSampleModuleNoOp(ModelWrapper):
    """Wraps ``module`` without hooks (same arguments as :class:`~dpnotebook.grad_sample.GradSampleModule`).

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
        super().__init__(module, batch_first=batch_first, loss_reduction=loss_reduction, strict=strict, K=K)
        self.hooks_enabled = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    def add_hooks(self) -> None:
        """Nothing to add."""

    def remove_hooks(self) -> None:
        """Nothing to remove."""
