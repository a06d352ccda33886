"""``GradientExplorer``: per-sample gradients of a real model, layer by layer and sample by sample.

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))
>>> batch = (torch.randn(5, 1, 4, 4), torch.randint(0, 3, (5,)))
>>> ex = GradientExplorer(model, batch, nn.functional.cross_entropy, backend="static")
>>> ex.set(layer="0.weight", sample=2)
>>> ex.gradient.image.get_array().shape                 # 2 x 1 filters of 3 x 3
(7, 3)
>>> "max |difference|" in ex.table.value
True
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets
from torch import Tensor, nn

from dpnotebook.widgets._explorer import Explorer
from dpnotebook.widgets.gradient import plots
from dpnotebook.widgets.gradient.state import GradientState

__all__ = ["GradientExplorer"]


class GradientExplorer(Explorer[GradientState]):
    """Norms of every sample's gradient per layer, one sample's gradient as a heatmap, and the
    grad-sample modes side by side with their largest difference.

    Args:
        model: the model (it is wrapped and unwrapped again, not changed).
        batch: ``(inputs, targets)``.
        loss_fn: ``loss_fn(output, targets)``, averaged.
        modes: the grad-sample modes to compare (default: all registered).
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("layer", "sample", "mode")

    def __init__(
        self,
        model: nn.Module,
        batch: tuple[Tensor, Tensor],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        *,
        modes: Sequence[str] | None = None,
        backend: str = "auto",
    ) -> None:
        state = GradientState(model, batch, loss_fn, modes=modes)
        self.table = ipywidgets.HTML(self._table(state))
        super().__init__(state, figsize=(11.0, 3.6), backend=backend)

    @staticmethod
    def _table(state: GradientState) -> str:
        rows = "".join(
            f"<tr><td><b>{html.escape(m)}</b></td><td>{html.escape(text)}</td></tr>"
            for m, text in state.comparison_rows()
        )
        return f"<table><tr><th>mode</th><th>vs {html.escape(state.reference)}</th></tr>{rows}</table>"

    def _title(self) -> str:
        s: GradientState = self.state
        shape = "x".join(str(d) for d in s.grads[s.mode][s.layer].shape[1:]) or "scalar"
        return f"{s.layer} [{shape}], sample {s.sample}, mode {s.mode}"

    def _build(self, fig: Any) -> None:
        s: GradientState = self.state
        ax_norms, ax_grad = fig.subplots(1, 2, width_ratios=[1.2, 1])
        self.norms = plots.draw_layer_norms(
            ax_norms, s.layers, s.layer_norms(), layer=s.layers.index(s.layer), sample=s.sample
        )
        self.gradient = plots.draw_gradient(ax_grad, s.gradient(), title=self._title())

    def _update(self) -> None:
        s: GradientState = self.state
        plots.update_layer_norms(self.norms, s.layer_norms(), layer=s.layers.index(s.layer), sample=s.sample)
        plots.update_gradient(self.gradient, s.gradient(), title=self._title())

    def _controls(self) -> list[ipywidgets.Widget]:
        s: GradientState = self.state
        layer = ipywidgets.Dropdown(options=s.layers, description="layer")
        sample = ipywidgets.IntSlider(min=0, max=s.batch_size - 1, description="sample")
        mode = ipywidgets.ToggleButtons(options=s.modes, description="mode")
        return [*self.bind_all(layer=layer, sample=sample, mode=mode), self.table]
