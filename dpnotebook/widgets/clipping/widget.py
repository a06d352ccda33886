"""``ClippingExplorer``: move C and watch what clipping does to real per-sample gradients.

>>> ex = ClippingExplorer(backend="static")          # the 2-D toy: arrows and the clipping ball
>>> ex.state.max_grad_norm = 0.5
>>> ex.label.get_text().startswith("C = 0.5 (flat): clipped")
True
>>> ex.state.max_grad_norm = 0
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: max_grad_norm=0.0 is invalid: it must be a number > 0 ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets
import numpy as np
import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.samplers._contracts import flat_rows
from dpnotebook.privacy import CLIPPING_MODES, per_layer_norms
from dpnotebook.widgets._explorer import Explorer
from dpnotebook.widgets.clipping import plots
from dpnotebook.widgets.clipping.state import ClippingState, ClippingStats
from dpnotebook.widgets.grads import flatten_grad_samples
from dpnotebook.widgets.toy import ToyProblem, grad_samples_of

__all__ = ["ClippingExplorer", "clipped_vectors"]


def clipped_vectors(grad_samples: Mapping[str, Tensor], stats: ClippingStats) -> np.ndarray:
    """Each sample's gradient multiplied by its clip factor(s) from :class:`ClippingStats`, ``[B, D]``."""
    factors = torch.as_tensor(stats.factors)
    parts = []
    for i, g in enumerate(grad_samples.values()):
        f = factors if factors.dim() == 1 else factors[i]
        parts.append(flat_rows(g).double() * f[:, None])
    return torch.cat(parts, dim=1).cpu().numpy()


class ClippingExplorer(Explorer[ClippingState]):
    """Per-sample gradient norms, the bound C, and the bias clipping puts in the mean gradient.

    Give a ``model`` with ``batch`` and ``loss_fn``, or ``grad_samples``, or a ``toy``; with
    nothing, the 2-D toy, whose gradients are drawn as arrows with the clipping ball.

    Args:
        model: a model whose per-sample gradients are computed (hooks mode).
        batch: ``(inputs, targets)`` for ``model``.
        loss_fn: ``loss_fn(output, targets)``, averaged.
        grad_samples: precomputed per-sample gradients instead of a model.
        toy: a :class:`~dpnotebook.widgets.toy.ToyProblem`.
        max_grad_norm: the starting C (default: the median norm).
        clipping: ``"flat"`` or ``"per_layer"``.
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("max_grad_norm", "clipping")

    def __init__(
        self,
        model: nn.Module | None = None,
        batch: tuple[Tensor, Tensor] | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        *,
        grad_samples: Mapping[str, Tensor] | list[Tensor] | None = None,
        toy: ToyProblem | None = None,
        max_grad_norm: float | None = None,
        clipping: str = "flat",
        backend: str = "auto",
    ) -> None:
        grads = grad_samples_of(model, batch, loss_fn, grad_samples, toy)
        state = ClippingState(grads, max_grad_norm=max_grad_norm, clipping=clipping)
        self._vectors = flatten_grad_samples(state.grad_samples).double().cpu().numpy()
        super().__init__(state, figsize=(12.0, 3.6) if state.is_2d else (9.0, 3.4), backend=backend)

    def _build(self, fig: Any) -> None:
        s: ClippingState = self.state
        stats = s.stats()
        axes = fig.subplots(1, 3 if s.is_2d else 2)
        self.arrows = None
        if s.is_2d:
            self.arrows = plots.draw_arrows(
                axes[0],
                self._vectors,
                clipped=clipped_vectors(s.grad_samples, stats),
                max_grad_norm=s.max_grad_norm,
                mean=stats.mean,
                clipped_mean=stats.clipped_mean,
            )
        layer_norms = None
        if s.num_layers > 1:
            layer_norms = per_layer_norms(s.grad_samples).double().cpu().numpy()
        self.hist = plots.draw_norm_histogram(axes[-2], s.norms, max_grad_norm=s.max_grad_norm, layer_norms=layer_norms)
        self.curves = plots.draw_bias_curves(axes[-1], s.curves(), max_grad_norm=s.max_grad_norm)
        self._curve_mode = s.clipping
        self.label = fig.suptitle(stats.label(), fontsize="medium")

    def _update(self) -> None:
        s: ClippingState = self.state
        stats = s.stats()
        c = s.max_grad_norm
        per_layer = s.clipping == "per_layer" and s.num_layers > 1
        plots.update_norm_histogram(
            self.hist, max_grad_norm=c, layer_threshold=stats.layer_threshold if per_layer else None
        )
        curves = None
        if self._curve_mode != s.clipping:
            curves, self._curve_mode = s.curves(), s.clipping
        plots.update_bias_curves(self.curves, max_grad_norm=c, curves=curves)
        if self.arrows is not None:
            plots.update_arrows(
                self.arrows,
                clipped=clipped_vectors(s.grad_samples, stats),
                max_grad_norm=c,
                clipped_mean=stats.clipped_mean,
                mean=stats.mean,
            )
        self.label.set_text(stats.label())

    def _controls(self) -> list[ipywidgets.Widget]:
        lo, hi = self.state.norm_range()
        slider = ipywidgets.FloatLogSlider(
            base=10, min=math.log10(lo), max=math.log10(hi), step=0.01, description="C", readout_format=".3g"
        )
        mode = ipywidgets.ToggleButtons(options=list(CLIPPING_MODES), description="clipping")
        return [self.bind("max_grad_norm", slider), self.bind("clipping", mode)]
