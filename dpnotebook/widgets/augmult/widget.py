"""``AugmultExplorer``: averaging each sample's gradient over K augmented copies.

>>> ex = AugmultExplorer(k_max=4, backend="static")
>>> ex.state.K = 4
>>> ex.curves.k_line.get_xdata()
[4, 4]
>>> ex.label.get_text().startswith("K = 4")
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets
from torch import Tensor, nn

from dpnotebook.widgets._explorer import Explorer, c_slider
from dpnotebook.widgets.augmult import plots
from dpnotebook.widgets.augmult.state import AugmultState

__all__ = ["AugmultExplorer"]


class AugmultExplorer(Explorer[AugmultState]):
    """Per-sample gradient norms, their augmentation variance and the fraction clipped as K grows.

    By default a small seeded MLP on the 2-D toy data, augmented with Gaussian
    noise. For images, pass e.g. ``augment=functools.partial(augment_copies, kind="shift", strength=2)``.

    Args:
        model, x, y, loss_fn, augment, k_max, K, max_grad_norm: see :class:`AugmultState`.
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("K", "max_grad_norm")

    def __init__(
        self,
        model: nn.Module | None = None,
        x: Tensor | None = None,
        y: Tensor | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        *,
        augment: Callable[..., Tensor] | None = None,
        k_max: int = 16,
        K: int = 1,
        max_grad_norm: float | None = None,
        backend: str = "auto",
    ) -> None:
        state = AugmultState(model, x, y, loss_fn, augment=augment, k_max=k_max, K=K, max_grad_norm=max_grad_norm)
        super().__init__(state, figsize=(12.0, 3.6), backend=backend)

    def _text(self) -> str:
        s: AugmultState = self.state
        t, k = s.table, s.K
        return (
            f"K = {k}: mean norm {t.norm[k - 1]:.3g} (K=1: {t.norm[0]:.3g})  |  augmentation variance "
            f"{t.variance[k - 1]:.3g} (K=1: {t.variance[0]:.3g})  |  clipped at C = {s.max_grad_norm:.3g}: "
            f"{100 * s.fractions()[k - 1]:.0f}%"
        )

    def _build(self, fig: Any) -> None:
        s: AugmultState = self.state
        ax_hist, ax_k, ax_frac = fig.subplots(1, 3)
        self.hist = plots.draw_k_histogram(ax_hist, s.table.norms, K=s.K, max_grad_norm=s.max_grad_norm)
        self.curves = plots.draw_k_curves(ax_k, s.table.norm, s.table.variance, K=s.K)
        self.fraction = plots.draw_fraction_curve(ax_frac, s.fractions(), K=s.K)
        self.label = fig.suptitle(self._text(), fontsize="small")

    def _update(self) -> None:
        s: AugmultState = self.state
        plots.update_k_histogram(self.hist, s.norms(), K=s.K, max_grad_norm=s.max_grad_norm)
        plots.update_k_curves(self.curves, K=s.K)
        plots.update_fraction_curve(self.fraction, s.fractions(), K=s.K)
        self.label.set_text(self._text())

    def _controls(self) -> list[ipywidgets.Widget]:
        s: AugmultState = self.state
        k = ipywidgets.IntSlider(min=1, max=s.k_max, description="K")
        return [self.bind("K", k), self.bind("max_grad_norm", c_slider(s.max_grad_norm))]
