"""The attack explorer's state: the Gaussian mechanism, an attacker's threshold, and real attacks.

The mechanism adds noise of std ``sigma`` to a query of sensitivity 1: without the record the
output is ``N(0, sigma^2)``, with it ``N(1, sigma^2)``. Saying "in" when the output is at least
``threshold`` gives one point ``(FPR, TPR)`` on the trade-off curve of ``mu = 1 / sigma``
(:func:`~dpnotebook.audit.gaussian_tpr`), under the ``(epsilon, delta)`` bound
(:func:`~dpnotebook.audit.dp_tpr_bound`). ``attacks`` holds real attacks' ROC curves and epsilons.

>>> s = AttackState(noise_multiplier=1.0, threshold=0.5)
>>> v = s.view()
>>> round(v.fpr, 4), round(v.tpr, 4), round(v.advantage, 4)    # 1 - Phi(0.5), Phi(0.5)
(0.3085, 0.6915, 0.3829)
>>> round(v.epsilon, 3)
4.377
>>> s.noise_multiplier = 0.0
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: noise_multiplier=0.0 is invalid: without noise epsilon is infinite; use sigma > 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import traitlets
from scipy.stats import norm

from dpnotebook.audit import AttackROC, dp_tpr_bound, gaussian_epsilon, gaussian_tpr
from dpnotebook.widgets._validate import noisy_sigma, one_of, quiet_delta, refuse

if TYPE_CHECKING:
    from dpnotebook.audit import AuditedRun

__all__ = ["AttackState", "AttackView", "Attack", "FPR_GRID", "simulated_attacks", "attacks_from_runs"]

#: the false positive rates where curves are drawn (log-spaced near 0, where attacks matter most)
FPR_GRID = np.unique(np.concatenate([[0.0], np.geomspace(1e-5, 1, 120), np.linspace(0, 1, 41)]))


@functools.lru_cache(maxsize=1024)
def _epsilon(mu: float, delta: float) -> float:
    return gaussian_epsilon(mu, delta)


@dataclass
class Attack:
    """A real attack's ROC curve and the epsilon its target was trained at (``inf``: not private).

    ``curve``, if known, is the target's exact trade-off curve at :data:`FPR_GRID`: the best any attack
    can do against it (tighter than the ``(epsilon, delta)`` bound).
    """

    roc: AttackROC
    epsilon: float
    delta: float = 1e-5
    curve: np.ndarray | None = None


@dataclass
class AttackView:
    """What the figure shows for one setting.

    Attributes:
        x: output values where the densities are drawn.
        density_out, density_in: the output's density without and with the record.
        fpr, tpr: the threshold attack's rates; ``advantage = tpr - fpr``.
        epsilon: the mechanism's epsilon at the state's delta.
        curve: the trade-off curve's TPR at :data:`FPR_GRID`.
        bound: the ``(epsilon, delta)`` bound at :data:`FPR_GRID`.
    """

    x: np.ndarray
    density_out: np.ndarray
    density_in: np.ndarray
    fpr: float
    tpr: float
    advantage: float
    epsilon: float
    curve: np.ndarray
    bound: np.ndarray


def simulated_attacks(
    noise_multipliers: tuple[float, ...] = (0.5, 1.0, 2.0), *, canaries: int = 2000, delta: float = 1e-5, seed: int = 0
) -> dict[str, Attack]:
    """Real attacks on the Gaussian mechanism: ``canaries`` records, each in on a coin, scored by the output.

    >>> a = simulated_attacks((1.0,), canaries=200)
    >>> list(a), round(a["sigma = 1"].epsilon, 2)
    (['sigma = 1'], 4.38)
    """
    from dpnotebook.audit import attack_roc, draw_inclusion, gaussian_mechanism_scores

    attacks = {}
    for i, sigma in enumerate(noise_multipliers):
        included = draw_inclusion(canaries, seed=seed + i)
        scores = gaussian_mechanism_scores(included, noise_multiplier=sigma, seed=seed + 1000 + i)
        attacks[f"sigma = {sigma:g}"] = Attack(
            attack_roc(scores[included], scores[~included]),
            _epsilon(1.0 / sigma, delta),
            delta,
            gaussian_tpr(FPR_GRID, 1 / sigma),
        )
    return attacks


def attacks_from_runs(runs: Mapping[str, AuditedRun], *, records: str = "canaries") -> dict[str, Attack]:
    """``{label: Attack}`` from ``{label: AuditedRun}`` (:func:`~dpnotebook.audit.audited_digits_run`).

    The ROC is the run's loss attack on its canaries (``records="canaries"``) or its digits (``"digits"``),
    the epsilon the accountant's, the curve of a private run its exact trade-off curve
    (:func:`~dpnotebook.audit.pld_tpr`).
    """
    from dpnotebook.audit import pld_tpr

    one_of("records", records, ["canaries", "digits"])
    attacks = {}
    for label, run in runs.items():
        curve = None
        if math.isfinite(run.epsilon) and run.steps > 0:
            curve = pld_tpr(
                FPR_GRID, noise_multiplier=run.noise_multiplier, sample_rate=run.sample_rate, steps=run.steps
            )
        roc = run.canary_attack if records == "canaries" else run.attack
        attacks[label] = Attack(roc, run.epsilon, run.delta, curve)
    return attacks


class AttackState(traitlets.HasTraits):
    """sigma, the attacker's threshold, delta and the attack shown, validated.

    Args:
        noise_multiplier: sigma, the noise std in units of the sensitivity (> 0).
        threshold: the attacker says "in" when the output is at least this.
        delta: the delta of the bound drawn.
        attacks: ``{label: Attack}``, real attacks to compare (may be empty).
        selected: the label of the attack whose bound is drawn.
    """

    noise_multiplier = traitlets.Float(1.0)
    threshold = traitlets.Float(0.5)
    delta = traitlets.Float(1e-5)
    selected = traitlets.Unicode("")

    def __init__(self, *, attacks: Mapping[str, Attack] | None = None, **values: object) -> None:
        self.attacks = dict(attacks or {})
        for label, attack in self.attacks.items():
            if not isinstance(attack, Attack):
                raise TypeError(f"attacks[{label!r}] is a {type(attack).__name__}: pass Attack(roc, epsilon, delta).")
        if self.attacks and not values.get("selected"):
            values["selected"] = next(iter(self.attacks))
        super().__init__(**values)

    @traitlets.validate("noise_multiplier")
    def _check_sigma(self, proposal: dict[str, Any]) -> float:
        sigma = noisy_sigma(proposal["value"])
        if not 0.05 <= sigma <= 100:  # below, float64 rounds an FPR near 1e-300 to 0 while the TPR stays near 1
            refuse("noise_multiplier", proposal["value"], "use 0.05 <= sigma <= 100 (outside: a corner, the diagonal).")
        return sigma

    @traitlets.validate("threshold")
    def _check_threshold(self, proposal: dict[str, Any]) -> float:
        t = proposal["value"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            refuse("threshold", t, "it must be a finite number (the output value above which the attacker says 'in').")
        return float(t)

    @traitlets.validate("delta")
    def _check_delta(self, proposal: dict[str, Any]) -> float:
        return quiet_delta(proposal["value"])

    @traitlets.validate("selected")
    def _check_selected(self, proposal: dict[str, Any]) -> str:
        if not self.attacks:
            if proposal["value"]:
                refuse("selected", proposal["value"], "no attacks were given.")
            return ""
        return one_of("selected", proposal["value"], list(self.attacks))

    @property
    def mu(self) -> float:
        """``1 / sigma``: how many noise stds one record moves the output."""
        return 1.0 / self.noise_multiplier

    def view(self) -> AttackView:
        """Densities, the attack's point, the trade-off curve and its bound (cheap: no accountant)."""
        sigma, t = self.noise_multiplier, self.threshold
        x = np.linspace(min(-4 * sigma, t - 0.5), max(1 + 4 * sigma, t + 0.5), 200)
        fpr, tpr = float(norm.sf(t / sigma)), float(norm.sf((t - 1) / sigma))
        eps = _epsilon(self.mu, self.delta)
        return AttackView(
            x=x,
            density_out=norm.pdf(x, 0.0, sigma),
            density_in=norm.pdf(x, 1.0, sigma),
            fpr=fpr,
            tpr=tpr,
            advantage=tpr - fpr,
            epsilon=eps,
            curve=gaussian_tpr(FPR_GRID, self.mu),
            bound=dp_tpr_bound(FPR_GRID, eps, self.delta),
        )

    def selected_curve(self) -> np.ndarray | None:
        """The selected attack's target's exact trade-off curve, if known."""
        return self.attacks[self.selected].curve if self.selected else None

    def selected_bound(self) -> np.ndarray | None:
        """The ``(epsilon, delta)`` bound of the selected attack's model at :data:`FPR_GRID` (``None``: none)."""
        if not self.selected:
            return None
        attack = self.attacks[self.selected]
        if math.isinf(attack.epsilon):
            return np.ones_like(FPR_GRID)
        return dp_tpr_bound(FPR_GRID, attack.epsilon, attack.delta)
