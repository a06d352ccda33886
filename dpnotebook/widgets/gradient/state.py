"""The gradient explorer's state: per-sample gradients of one batch in every grad-sample mode (a failing
mode keeps its error text, shown instead of its gradients).

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> s = GradientState(nn.Linear(3, 2), (torch.randn(4, 3), torch.randn(4, 2)), nn.functional.mse_loss)
>>> s.layer, s.sample, s.mode
('weight', 0, 'hooks')
>>> s.sample = 9
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: sample=9 is invalid: it must be an integer between 0 and 3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch  # noqa: F401  (the doctests use it)
import traitlets
from torch import Tensor, nn

from dpnotebook.modes import available_modes
from dpnotebook.privacy import per_layer_norms, per_sample_norms
from dpnotebook.widgets._validate import int_at_least, one_of, refuse
from dpnotebook.widgets.grads import run_mode

__all__ = ["GradientState", "grad_samples_by_mode", "max_difference"]


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest absolute difference between two sets of per-sample gradients.

    >>> max_difference({"w": torch.zeros(2, 3)}, {"w": torch.full((2, 3), 0.5)})
    0.5
    """
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def grad_samples_by_mode(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    modes: Sequence[str] | None = None,
) -> tuple[dict[str, dict[str, Tensor]], dict[str, Tensor], dict[str, str]]:
    """Per-sample gradients in each mode (one :func:`~dpnotebook.widgets.grads.run_mode` each), the norms
    of modes that compute only norms, and errors (against the float64 oracle: :func:`dpnotebook.compare.compare_modes`).

    Returns:
        ``(grads, norms_only, errors)``: ``grads[mode][param_name]`` is ``[B, *shape]``;
        ``norms_only[mode]`` is ``[B]`` for a mode such as ``"ghost"``; ``errors[mode]``
        is ``"TypeName: message"`` for a mode that failed.
    """
    grads: dict[str, dict[str, Tensor]] = {}
    norms_only: dict[str, Tensor] = {}
    errors: dict[str, str] = {}
    for mode in modes if modes is not None else available_modes():
        try:
            result = run_mode(model, inputs, targets, loss_fn, mode=mode)
        except Exception as exc:  # noqa: BLE001 - a failing mode is reported, not fatal
            errors[mode] = f"{type(exc).__name__}: {exc}"
            continue
        if isinstance(result, Tensor):
            norms_only[mode] = result
        else:
            grads[mode] = result
    return grads, norms_only, errors


class GradientState(traitlets.HasTraits):
    """Which layer (parameter tensor), which sample and which mode's gradients to show.

    Args:
        model: the model.
        batch: ``(inputs, targets)``.
        loss_fn: ``loss_fn(output, targets)``, averaged.
        modes: the modes to compare (default: all registered).
        reference: the mode others are compared with (default ``"hooks"`` or the first that works).

    Raises:
        RuntimeError: no mode could compute the gradients (the errors are listed).
    """

    layer = traitlets.Unicode()
    sample = traitlets.Int(0)
    mode = traitlets.Unicode()

    def __init__(
        self,
        model: nn.Module,
        batch: tuple[Tensor, Tensor],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        *,
        modes: Sequence[str] | None = None,
        reference: str = "hooks",
    ) -> None:
        self.grads, self.norms_only, self.errors = grad_samples_by_mode(model, batch[0], batch[1], loss_fn, modes)
        if not self.grads:
            lines = "\n".join(f"  {m}: {e}" for m, e in self.errors.items())
            raise RuntimeError(f"no grad-sample mode could compute per-sample gradients:\n{lines}")
        self.modes = list(self.grads) + list(self.norms_only) + list(self.errors)
        self.reference = reference if reference in self.grads else next(iter(self.grads))
        first = self.grads[self.reference]
        self.layers = list(first)
        self.batch_size = int(next(iter(first.values())).shape[0])
        self.differences = {m: max_difference(g, first) for m, g in self.grads.items()}
        ref_norms = per_sample_norms(first).double()
        self.norm_differences = {m: float((n.double() - ref_norms).abs().max()) for m, n in self.norms_only.items()}
        self._norms: dict[str, np.ndarray] = {}
        super().__init__(layer=self.layers[0], sample=0, mode=self.reference)

    @traitlets.validate("layer")
    def _check_layer(self, proposal: dict[str, Any]) -> str:
        return one_of("layer", proposal["value"], self.layers)

    @traitlets.validate("sample")
    def _check_sample(self, proposal: dict[str, Any]) -> int:
        return int_at_least("sample", proposal["value"], 0, self.batch_size - 1)

    @traitlets.validate("mode")
    def _check_mode(self, proposal: dict[str, Any]) -> str:
        mode = proposal["value"]
        if mode in self.errors:
            refuse("mode", mode, f"this mode failed on the model: {self.errors[mode]}")
        if mode in self.norms_only:
            why = "this mode computes per-sample gradient norms without forming the gradients; pick another mode."
            refuse("mode", mode, why)
        return one_of("mode", mode, list(self.grads))

    def layer_norms(self) -> np.ndarray:
        """Norms ``[L, B]`` of each sample's gradient per layer, in the current mode (cached)."""
        if self.mode not in self._norms:
            self._norms[self.mode] = per_layer_norms(self.grads[self.mode]).double().cpu().numpy()
        return self._norms[self.mode]

    def gradient(self) -> np.ndarray:
        """The selected sample's gradient of the selected layer, shaped like the parameter."""
        return self.grads[self.mode][self.layer][self.sample].double().cpu().numpy()

    def comparison_rows(self) -> list[tuple[str, str]]:
        """``(mode, "max |difference| vs reference" or the error)`` for each mode."""

        def row(mode: str) -> str:
            if mode in self.errors:
                return f"failed: {self.errors[mode]}"
            if mode in self.norms_only:
                return f"norms only: max |norm difference| = {self.norm_differences[mode]:.2e}"
            return "reference" if mode == self.reference else f"max |difference| = {self.differences[mode]:.2e}"

        return [(mode, row(mode)) for mode in self.modes]
