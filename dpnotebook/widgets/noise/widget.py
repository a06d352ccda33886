"""``NoiseExplorer``: how sigma, B and C set the noise on the averaged gradient.

>>> ex = NoiseExplorer(backend="static")                 # the 2-D toy
>>> ex.set(noise_multiplier=2.0, batch_size=32)
>>> ex.snr.point.get_xdata()
[32]
>>> ex.label.get_text().startswith("sigma = 2")
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets
from torch import Tensor, nn

from dpnotebook.widgets._explorer import Explorer, c_slider
from dpnotebook.widgets.noise import plots
from dpnotebook.widgets.noise.state import NoiseState, NoiseView
from dpnotebook.widgets.toy import ToyProblem, grad_samples_of

__all__ = ["NoiseExplorer"]


class NoiseExplorer(Explorer[NoiseState]):
    """The true mean gradient against noisy averaged gradients (2-D projection), and the
    signal-to-noise ratio against the batch size.

    Give a ``model`` with ``batch`` and ``loss_fn``, or ``grad_samples``, or a ``toy`` (default: the
    2-D toy, 256 points). In more dimensions the plane shown holds the mean gradient and a random direction.

    Args:
        model: a model whose per-sample gradients form the pool.
        batch: ``(inputs, targets)``.
        loss_fn: ``loss_fn(output, targets)``, averaged.
        grad_samples: a precomputed pool instead.
        toy: a :class:`~dpnotebook.widgets.toy.ToyProblem`.
        noise_multiplier, batch_size, max_grad_norm, draws, seed: see :class:`NoiseState`.
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("noise_multiplier", "batch_size", "max_grad_norm", "draws")

    def __init__(
        self,
        model: nn.Module | None = None,
        batch: tuple[Tensor, Tensor] | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        *,
        grad_samples: Mapping[str, Tensor] | list[Tensor] | None = None,
        toy: ToyProblem | None = None,
        noise_multiplier: float = 1.0,
        batch_size: int | None = None,
        max_grad_norm: float | None = None,
        draws: int = 20,
        seed: int = 0,
        backend: str = "auto",
    ) -> None:
        state = NoiseState(
            grad_samples_of(model, batch, loss_fn, grad_samples, toy, n=256),
            noise_multiplier=noise_multiplier,
            batch_size=batch_size,
            max_grad_norm=max_grad_norm,
            draws=draws,
            seed=seed,
        )
        super().__init__(state, figsize=(10.0, 3.8), backend=backend)

    def _text(self, v: NoiseView) -> str:
        s: NoiseState = self.state
        snr = "inf (no noise: not private)" if math.isinf(v.snr) else f"{v.snr:.3g}"
        return (
            f"sigma = {s.noise_multiplier:.3g}, B = {s.batch_size}, C = {s.max_grad_norm:.3g}: "
            f"noise std per coordinate sigma*C/B = {v.noise_std:.3g}  |  SNR = {snr}  |  "
            f"mean cos(noisy, true) = {v.cosine:.2f}  |  clipped {100 * v.fraction_clipped:.0f}%"
        )

    def _build(self, fig: Any) -> None:
        s: NoiseState = self.state
        v = s.view()
        ax_cloud, ax_snr = fig.subplots(1, 2)
        self.cloud = plots.draw_noise_cloud(
            ax_cloud, true_mean=v.true_mean, clipped_mean=v.clipped_mean, noisy=v.noisy, noise_std=v.noise_std
        )
        ax_cloud.set_title("2-D projection" if s.dim > 2 else "gradient plane", fontsize="small")
        sizes, snr = s.snr_curve()
        self.snr = plots.draw_snr_curve(ax_snr, sizes, snr, batch_size=s.batch_size, current=v.snr)
        self.label = fig.suptitle(self._text(v), fontsize="small")

    def _update(self) -> None:
        s: NoiseState = self.state
        v = s.view()
        plots.update_noise_cloud(
            self.cloud, true_mean=v.true_mean, clipped_mean=v.clipped_mean, noisy=v.noisy, noise_std=v.noise_std
        )
        sizes, snr = s.snr_curve()
        plots.update_snr_curve(self.snr, sizes, snr, batch_size=s.batch_size, current=v.snr)
        self.label.set_text(self._text(v))

    def _controls(self) -> list[ipywidgets.Widget]:
        return self.bind_all(
            noise_multiplier=ipywidgets.FloatSlider(min=0.0, max=10.0, step=0.05, description="sigma"),
            batch_size=ipywidgets.IntSlider(min=1, max=self.state.pool_size, description="batch size"),
            max_grad_norm=c_slider(self.state.max_grad_norm),
            draws=ipywidgets.IntSlider(min=1, max=100, description="draws"),
        )
