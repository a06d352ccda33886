"""``PrivacyAttackExplorer``: what epsilon means to an attacker.

>>> ex = PrivacyAttackExplorer(backend="static")           # simulated attacks on the Gaussian mechanism
>>> ex.set(noise_multiplier=2.0, threshold=0.5)
>>> [round(float(v), 3) for v in ex.tradeoff.point.get_xydata()[0]]   # 1 - Phi(1/4), Phi(1/4)
[0.401, 0.599]
>>> ex.label.get_text().startswith("sigma = 2")
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ipywidgets
import numpy as np

from dpnotebook.widgets._explorer import Explorer
from dpnotebook.widgets.attack import plots
from dpnotebook.widgets.attack.state import FPR_GRID, Attack, AttackState, AttackView, simulated_attacks

__all__ = ["PrivacyAttackExplorer"]


class PrivacyAttackExplorer(Explorer[AttackState]):
    """The Gaussian mechanism's output with and without one record and an attacker's threshold; the
    attacker's (FPR, TPR) on the trade-off curve under the ``(epsilon, delta)`` bound (both of its lines,
    :func:`~dpnotebook.audit.dp_tpr_bound`); real attacks' ROC curves (log-log), the selected one red with
    its target's best attacks (green) and bound (dashed).

    Args:
        attacks: ``{label: Attack}`` (e.g. :func:`~dpnotebook.widgets.attack.state.attacks_from_runs`);
            default: :func:`~dpnotebook.widgets.attack.state.simulated_attacks` at sigma 0.5, 1 and 2.
        noise_multiplier, threshold, delta, selected: see :class:`AttackState`.
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("noise_multiplier", "threshold", "delta", "selected")
    tick_bins = 3

    def __init__(
        self,
        *,
        attacks: Mapping[str, Attack] | None = None,
        noise_multiplier: float = 1.0,
        threshold: float = 0.5,
        delta: float = 1e-5,
        selected: str = "",
        backend: str = "auto",
    ) -> None:
        state = AttackState(
            attacks=simulated_attacks(delta=delta) if attacks is None else attacks,
            noise_multiplier=noise_multiplier,
            threshold=threshold,
            delta=delta,
            selected=selected,
        )
        super().__init__(state, figsize=(11.0, 3.6), backend=backend)

    def _text(self, v: AttackView) -> str:
        s: AttackState = self.state
        eps = "inf" if math.isinf(v.epsilon) else f"{v.epsilon:.3g}"
        return (
            f"sigma = {s.noise_multiplier:.3g} (mu = {s.mu:.3g}), threshold {s.threshold:.2f}: "
            f"FPR = {v.fpr:.3f}, TPR = {v.tpr:.3f}, advantage TPR - FPR = {v.advantage:.3f}  |  "
            f"epsilon = {eps} at delta = {s.delta:g}: TPR <= e^eps FPR + delta and "
            "1 - TPR >= e^-eps (1 - FPR - delta)"
        )

    def _roc_title(self) -> str:
        s: AttackState = self.state
        if not s.selected:
            return "real attacks: none given"
        eps = s.attacks[s.selected].epsilon
        return f"{s.selected} (eps {'inf' if math.isinf(eps) else f'{eps:.3g}'}): attack red, best green"

    def _rocs(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        # each ROC read at FPR_GRID (the best TPR at FPR <= each grid point): ~200 points a line, not thousands
        index = {
            k: np.searchsorted(a.roc.fpr, FPR_GRID + 1e-12, side="right") - 1 for k, a in self.state.attacks.items()
        }
        return {k: (FPR_GRID, self.state.attacks[k].roc.tpr[i]) for k, i in index.items()}

    def _build(self, fig: Any) -> None:
        s: AttackState = self.state
        v = s.view()
        ax_density, ax_tradeoff, ax_roc = fig.subplots(1, 3)
        self.densities = plots.draw_densities(ax_density, v.x, v.density_out, v.density_in, threshold=s.threshold)
        ax_density.set_title("output without (blue) / with (red) the record", fontsize="small")
        self.tradeoff = plots.draw_tradeoff(ax_tradeoff, FPR_GRID, v.curve, v.bound, point=(v.fpr, v.tpr))
        ax_tradeoff.set_title("best attacks (green), (eps, delta) bound (dashed)", fontsize="small")
        self.rocs = plots.draw_rocs(
            ax_roc, self._rocs(), FPR_GRID, s.selected_bound(), selected=s.selected, curve=s.selected_curve()
        )
        self.roc_title = ax_roc.set_title(self._roc_title(), fontsize="small")
        self.label = fig.suptitle(self._text(v), fontsize="small")

    def _update(self) -> None:
        s: AttackState = self.state
        v = s.view()
        plots.update_densities(self.densities, v.x, v.density_out, v.density_in, threshold=s.threshold)
        plots.update_tradeoff(self.tradeoff, FPR_GRID, v.curve, v.bound, point=(v.fpr, v.tpr))
        plots.update_rocs(self.rocs, FPR_GRID, s.selected_bound(), selected=s.selected, curve=s.selected_curve())
        self.roc_title.set_text(self._roc_title())
        self.label.set_text(self._text(v))

    def _controls(self) -> list[ipywidgets.Widget]:
        attacks = list(self.state.attacks)
        return self.bind_all(
            noise_multiplier=ipywidgets.FloatLogSlider(
                base=10, min=-1, max=1, step=0.01, description="sigma", readout_format=".3g"
            ),
            threshold=ipywidgets.FloatSlider(min=-3.0, max=4.0, step=0.01, description="threshold"),
            delta=ipywidgets.FloatLogSlider(
                base=10, min=-10, max=-1, step=0.1, description="delta", readout_format=".1e"
            ),
            **({"selected": ipywidgets.Dropdown(options=attacks, description="attack")} if attacks else {}),
        )
