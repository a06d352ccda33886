"""The ghost-clipping criterion: Opacus' ``DPLossFastGradientClipping`` over dpnotebook's ghost mode.

Opacus 1.5+ trains with ghost clipping through a wrapped loss:
``make_private(..., criterion=criterion, grad_sample_mode="ghost")`` returns
``(model, optimizer, criterion, data_loader)`` and ``criterion(output, target)``
gives a :class:`DPTensorFastGradientClipping` whose ``backward()`` does what the
clipped step needs. Opacus runs two backward passes there (norms, then the
clip-factor-weighted loss). dpnotebook's ghost mode
(:mod:`dpnotebook.grad_sample.ghost._wrapper`) needs one: the wrapper records each
layer's activations and backprops, and the
:class:`~dpnotebook.privacy.ghost_optimizer.GhostDPOptimizer` forms the norms and
the clipped sum at ``step()``. So ``backward()`` here is one ordinary backward
of the reduced loss, and the result of ``backward(); step()`` is the same private
step. The one visible difference: ``p.grad`` is not filled by ``backward()``
(Opacus puts the clipped, un-noised sum there); it is filled by ``step()``.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> from dpnotebook.privacy.ghost_optimizer import GhostDPOptimizer
>>> model = wrap_model(nn.Linear(3, 2), "ghost")
>>> opt = GhostDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
...                        max_grad_norm=1.0, expected_batch_size=4)
>>> criterion = DPLossFastGradientClipping(model, opt, nn.CrossEntropyLoss())
>>> loss = criterion(model(torch.randn(4, 3)), torch.tensor([0, 1, 1, 0]))
>>> loss.loss_per_sample.shape, isinstance(loss.item(), float)
(torch.Size([4]), True)
>>> loss.backward()
>>> opt.step()
>>> opt.last_step_stats.batch_size
4
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from dpnotebook.grad_sample._engine.hooks import LOSS_REDUCTIONS

__all__ = ["DPLossFastGradientClipping", "DPTensorFastGradientClipping"]


class DPTensorFastGradientClipping:
    """A per-sample loss whose :meth:`backward` runs the ghost-mode backward pass.

    Args:
        module: the ghost-mode model (from ``make_private(grad_sample_mode="ghost")``).
        optimizer: its optimizer.
        loss_per_sample: the loss of each row, shape ``[rows]`` (or any shape; it is reduced whole).
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.

    Arithmetic with numbers and other such losses (``loss / 2``, ``a + b``, ``0.5 * loss``)
    acts on the per-sample losses, as in Opacus.
    """

    def __init__(
        self, module: nn.Module, optimizer: Any, loss_per_sample: Tensor, loss_reduction: str = "mean"
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.loss_per_sample = loss_per_sample
        self.loss_reduction = loss_reduction

    def _like(self, loss_per_sample: Tensor) -> DPTensorFastGradientClipping:
        return DPTensorFastGradientClipping(self.module, self.optimizer, loss_per_sample, self.loss_reduction)

    def _other(self, other: Any) -> Any:
        if isinstance(other, DPTensorFastGradientClipping):
            if other.loss_reduction != self.loss_reduction:
                raise ValueError(
                    f"cannot combine a loss with loss_reduction={self.loss_reduction!r} and one with "
                    f"loss_reduction={other.loss_reduction!r}. Fix: use one reduction for both criteria."
                )
            return other.loss_per_sample
        return other

    def reduced(self) -> Tensor:
        """The loss as the criterion would have reduced it (mean or sum over every element)."""
        return self.loss_per_sample.mean() if self.loss_reduction == "mean" else self.loss_per_sample.sum()

    def detach(self) -> Tensor:
        return self.reduced().detach()

    def item(self) -> float:
        return self.detach().item()

    def backward(self) -> None:
        """One backward pass of the reduced loss: the ghost wrapper records what the step needs."""
        self.reduced().backward()

    def __truediv__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample / self._other(other))

    def __mul__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample * self._other(other))

    __rmul__ = __mul__

    def __add__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample + self._other(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample - self._other(other))

    def __rsub__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self._other(other) - self.loss_per_sample)

    def __neg__(self) -> DPTensorFastGradientClipping:
        return self._like(-self.loss_per_sample)

    def __repr__(self) -> str:
        return f"DPTensorFastGradientClipping(loss_reduction={self.loss_reduction}, shape={self.loss_per_sample.shape})"

    def __str__(self) -> str:
        return f"DPTensorFastGradientClipping({self.item():.4f})"


class DPLossFastGradientClipping:
    """Wraps a criterion so that it returns a :class:`DPTensorFastGradientClipping` (Opacus' API).

    Args:
        module: the ghost-mode model.
        optimizer: its :class:`~dpnotebook.privacy.ghost_optimizer.GhostDPOptimizer`.
        criterion: a loss with a ``reduction`` attribute (``nn.CrossEntropyLoss()``, ...);
            one without gets the module's.
        loss_reduction: ``"mean"`` or ``"sum"``; it must equal the criterion's, the
            module's and the optimizer's (a ``ValueError`` names the one that differs).
    """

    def __init__(self, module: nn.Module, optimizer: Any, criterion: Any, loss_reduction: str = "mean") -> None:
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction={loss_reduction!r} is invalid; use one of {LOSS_REDUCTIONS}.")
        if not hasattr(criterion, "reduction"):
            criterion.reduction = module.loss_reduction
        for name, value in (
            ("criterion.reduction", criterion.reduction),
            ("the module's loss_reduction", module.loss_reduction),
            ("the optimizer's loss_reduction", optimizer.loss_reduction),
        ):
            if value != loss_reduction:
                raise ValueError(
                    f"{name} is {value!r} but loss_reduction={loss_reduction!r}: the clipped step would be "
                    f"scaled wrongly. Fix: construct the criterion with reduction={loss_reduction!r} and pass "
                    f"loss_reduction={loss_reduction!r} to make_private."
                )
        self.module = module
        self.optimizer = optimizer
        self.criterion = criterion
        self.loss_reduction = loss_reduction

    def __call__(self, *args: Any, shape: tuple[int, ...] | None = None, **kwargs: Any) -> DPTensorFastGradientClipping:
        """The per-sample losses (the criterion with ``reduction="none"``), wrapped.

        Args:
            *args: the criterion's arguments (output, target).
            shape: for sequence tasks, the logits' shape ``[B, T, vocab]`` before flattening:
                the ``B*T`` losses are then reduced over ``T`` per sequence (positions equal to the
                criterion's ``ignore_index`` left out of a mean), as in Opacus.
            **kwargs: the criterion's keyword arguments.
        """
        old = self.criterion.reduction
        self.criterion.reduction = "none"
        try:
            loss = self.criterion(*args, **kwargs)
        finally:
            self.criterion.reduction = old
        if shape is not None and loss.shape[0] == shape[0] * shape[1]:
            loss = loss.view(shape[0], shape[1])
            if self.loss_reduction == "sum":
                loss = loss.sum(dim=1)
            else:
                ignore = getattr(self.criterion, "ignore_index", None)
                targets = kwargs.get("target", args[1] if len(args) >= 2 else None)
                if ignore is not None and isinstance(targets, Tensor):
                    valid = (targets.view(shape[0], shape[1]) != ignore).sum(dim=1).clamp(min=1)
                    loss = loss.sum(dim=1) / valid
                else:
                    loss = loss.mean(dim=1)
        return DPTensorFastGradientClipping(self.module, self.optimizer, loss, self.loss_reduction)

    def __repr__(self) -> str:
        return f"DPLossFastGradientClipping({self.criterion!r}, loss_reduction={self.loss_reduction!r})"
