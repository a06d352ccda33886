"""``PrivacyBudgetExplorer``: epsilon against epochs, and the sigma a target epsilon needs.

Accountant calls are slow, so a new setting is computed once the sliders stop moving; results are cached.

>>> ex = PrivacyBudgetExplorer(accountant="rdp", epochs=3, backend="static")
>>> before = ex.curves.current.get_ydata()[-1]
>>> ex.state.noise_multiplier = 2.0
>>> bool(ex.curves.current.get_ydata()[-1] < before)      # more noise, less epsilon
True
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets

from dpnotebook.widgets._explorer import Debouncer, Explorer
from dpnotebook.widgets.budget import plots
from dpnotebook.widgets.budget.state import BudgetResult, BudgetState

__all__ = ["PrivacyBudgetExplorer"]


class PrivacyBudgetExplorer(Explorer[BudgetState]):
    """Epsilon spent against epochs for sigma, batch size, dataset size, delta and accountant.

    Args:
        noise_multiplier, batch_size, dataset_size, epochs, delta, accountant, target_epsilon, points:
            see :class:`BudgetState`.
        debounce: seconds of quiet before a new setting is computed (in a kernel).
        backend: see :class:`~dpnotebook.widgets._figure.FigureHost`.
    """

    watch = ("noise_multiplier", "batch_size", "dataset_size", "epochs", "delta", "accountant", "target_epsilon")

    def __init__(
        self,
        *,
        noise_multiplier: float = 1.0,
        batch_size: int = 256,
        dataset_size: int = 60000,
        epochs: int = 10,
        delta: float = 1e-5,
        accountant: str = "pld",
        target_epsilon: float = 3.0,
        points: int = 8,
        debounce: float = 0.3,
        backend: str = "auto",
    ) -> None:
        state = BudgetState(
            noise_multiplier=noise_multiplier,
            batch_size=batch_size,
            dataset_size=dataset_size,
            epochs=epochs,
            delta=delta,
            accountant=accountant,
            target_epsilon=target_epsilon,
            points=points,
        )
        self.debouncer = Debouncer(self._compute_now, delay=debounce)
        self.status = ipywidgets.HTML()
        self._shown: BudgetResult | None = None
        super().__init__(state, figsize=(8.0, 3.6), backend=backend)

    @property
    def pending(self) -> bool:
        """``True`` while a new setting waits to be computed."""
        return self.debouncer.pending

    def _compute_now(self) -> None:
        try:
            self.state.compute()
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.error.show(exc)
            return
        self.refresh()

    def _text(self, r: BudgetResult) -> str:
        s: BudgetState = self.state
        need = (
            f"sigma needed for epsilon = {s.target_epsilon:g}: {r.required_sigma:.3g}"
            if math.isfinite(r.required_sigma)
            else f"sigma needed: {r.required_error}"
        )
        return (
            f"q = {s.sample_rate:.3g}, {s.steps(s.epochs)} steps: epsilon = {r.epsilon:.3g} "
            f"at delta = {s.delta:g} ({s.accountant})  |  {need}"
        )

    def _build(self, fig: Any) -> None:
        s: BudgetState = self.state
        r = s.compute()
        ax = fig.subplots()
        self.curves = plots.draw_epsilon_curves(
            ax, r.epochs, r.epsilons, target_epsilon=s.target_epsilon, required=r.required_epsilons
        )
        self.label = fig.suptitle(self._text(r), fontsize="small")
        self._shown = r

    def _update(self) -> None:
        s: BudgetState = self.state
        r = s.cached()
        if r is None and self.debouncer.immediate:
            r = s.compute()
        pending = r is None
        if pending:
            self.debouncer()
        else:
            self.debouncer.cancel()
            self._shown = r
        shown = self._shown
        if shown is not None:
            plots.update_epsilon_curves(
                self.curves,
                shown.epochs,
                shown.epsilons,
                target_epsilon=s.target_epsilon,
                required=shown.required_epsilons,
                pending=pending,
            )
        if r is None:
            self.label.set_text("computing epsilon ...")
            self.status.value = "<i>computing ...</i>"
            return
        self.label.set_text(self._text(r))
        note = s.delta_note()
        self.status.value = f"epsilon = <b>{r.epsilon:.3g}</b>" + (
            f' <span style="color:#b06000">{note}</span>' if note else ""
        )

    def _controls(self) -> list[ipywidgets.Widget]:
        sigma = ipywidgets.FloatLogSlider(
            base=10, min=-1, max=1.3, step=0.01, description="sigma", readout_format=".3g"
        )
        return self.bind_all(
            noise_multiplier=sigma,
            batch_size=ipywidgets.IntText(description="batch size"),
            dataset_size=ipywidgets.IntText(description="dataset size"),
            epochs=ipywidgets.IntSlider(min=1, max=max(100, self.state.epochs), description="epochs"),
            delta=ipywidgets.FloatText(description="delta"),
            accountant=ipywidgets.ToggleButtons(options=["rdp", "pld"], description="accountant"),
            target_epsilon=ipywidgets.FloatText(description="target eps"),
        ) + [self.status]
