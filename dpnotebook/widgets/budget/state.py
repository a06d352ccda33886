"""The privacy-budget explorer's state: sigma, batch and dataset size, epochs, delta, accountant.

Every epsilon comes from the library's ``compute_epsilon`` and ``get_noise_multiplier``; results are
cached, so moving back to a setting seen before costs nothing.

>>> s = BudgetState(noise_multiplier=1.0, batch_size=256, dataset_size=60000, epochs=5, accountant="rdp")
>>> s.sample_rate, s.steps(5)
(0.004266666666666667, 1170)
>>> s.cached() is None                      # nothing computed yet
True
>>> round(s.compute().epsilon, 2)
1.13
>>> s.delta = 1.0
Traceback (most recent call last):
...
dpnotebook.widgets.WidgetValueError: delta=1.0 is invalid: it must be in (0, 1) ...
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import traitlets

from dpnotebook.privacy import (
    available_accountants,
    compute_epsilon,
    get_noise_multiplier,
    steps_for_epochs,
    steps_per_epoch,
)
from dpnotebook.privacy._arguments import check_choice, check_delta, check_epsilon
from dpnotebook.widgets._validate import bounded_cache, int_at_least, library_check, noisy_sigma, quiet_delta, refuse

__all__ = ["BudgetResult", "BudgetState"]

_KEY = ("noise_multiplier", "sample_rate", "epochs", "delta", "accountant", "target_epsilon", "points")


@dataclass
class BudgetResult:
    """Epsilon against epochs at the current sigma, and the sigma that meets the target.

    Attributes:
        epochs: the epochs where epsilon was computed.
        epsilons: epsilon after each of them, at the current sigma.
        epsilon: epsilon after all the epochs.
        required_sigma: the smallest sigma meeting the target after all the epochs (``nan``: not found).
        required_epsilons: epsilon against ``epochs`` at ``required_sigma``.
        required_error: why ``required_sigma`` could not be found, or ``""``.
    """

    epochs: np.ndarray
    epsilons: np.ndarray
    epsilon: float
    required_sigma: float
    required_epsilons: np.ndarray
    required_error: str = ""


class BudgetState(traitlets.HasTraits):
    """Validated accounting settings.

    Args:
        noise_multiplier: sigma (> 0).
        batch_size: expected batch size B; the sample rate is ``B / dataset_size``.
        dataset_size: N (>= B).
        epochs: number of epochs (steps = ``ceil(epochs * round(1 / sample_rate))``, as in
            :func:`~dpnotebook.privacy.steps_for_epochs` and ``make_private_with_epsilon``).
        delta: delta in (0, 1).
        accountant: ``"pld"`` (the default, as in ``PrivacyEngine``) or ``"rdp"`` (``"prv"`` = ``"pld"``).
        target_epsilon: the budget the required sigma is searched for.
        points: how many epochs along the curve epsilon is computed at.
    """

    noise_multiplier = traitlets.Float(1.0)
    batch_size = traitlets.Int(256)
    dataset_size = traitlets.Int(60000)
    epochs = traitlets.Int(10)
    delta = traitlets.Float(1e-5)
    accountant = traitlets.Unicode("pld")  # PrivacyEngine's default
    target_epsilon = traitlets.Float(3.0)

    def __init__(self, *, points: int = 8, **values: object) -> None:
        self.points = int_at_least("points", points, 2)
        self._results: dict[tuple[Any, ...], BudgetResult] = {}
        super().__init__(**values)

    @traitlets.validate("noise_multiplier")
    def _check_sigma(self, proposal: dict[str, Any]) -> float:
        return noisy_sigma(proposal["value"])

    @traitlets.validate("batch_size")
    def _check_batch(self, proposal: dict[str, Any]) -> int:
        b = int_at_least("batch_size", proposal["value"], 1)
        if b > self.dataset_size:
            refuse("batch_size", b, f"it must be <= dataset_size={self.dataset_size}.")
        return b

    @traitlets.validate("dataset_size")
    def _check_dataset(self, proposal: dict[str, Any]) -> int:
        n = int_at_least("dataset_size", proposal["value"], 1)
        if n < self.batch_size:
            refuse("dataset_size", n, f"it must be >= batch_size={self.batch_size}.")
        return n

    @traitlets.validate("epochs")
    def _check_epochs(self, proposal: dict[str, Any]) -> int:
        return int_at_least("epochs", proposal["value"], 1, 10_000)

    @traitlets.validate("delta")
    def _check_delta(self, proposal: dict[str, Any]) -> float:
        return quiet_delta(proposal["value"])

    @traitlets.validate("accountant")
    def _check_accountant(self, proposal: dict[str, Any]) -> str:
        return library_check(check_choice, "accountant", proposal["value"], available_accountants())

    @traitlets.validate("target_epsilon")
    def _check_target(self, proposal: dict[str, Any]) -> float:
        return library_check(check_epsilon, proposal["value"])

    @property
    def sample_rate(self) -> float:
        """q = batch_size / dataset_size."""
        return self.batch_size / self.dataset_size

    def steps(self, epochs: float) -> int:
        """Steps in ``epochs`` epochs of a Poisson loader: ``ceil(epochs * round(1 / q))``, the library's one rule."""
        return steps_for_epochs(epochs, steps_per_epoch(self.sample_rate))

    def delta_note(self) -> str:
        """The library's warning when delta is not well below 1/N, else ``""``."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_delta(self.delta, dataset_size=self.dataset_size)
        return str(caught[0].message) if caught else ""

    def epoch_grid(self) -> np.ndarray:
        """The epochs where epsilon is computed (always includes 1 and ``epochs``)."""
        return np.unique(np.linspace(1, self.epochs, min(self.epochs, self.points)).round().astype(int))

    def key(self) -> tuple[Any, ...]:
        """What a result depends on."""
        return tuple(getattr(self, name) for name in _KEY)

    def cached(self) -> BudgetResult | None:
        """The result for the current settings if it was computed before, else ``None``."""
        return self._results.get(self.key())

    def _curve(self, sigma: float, grid: np.ndarray) -> np.ndarray:
        eps = partial(compute_epsilon, sample_rate=self.sample_rate, delta=self.delta, accountant=self.accountant)
        return np.array([eps(noise_multiplier=sigma, steps=self.steps(e)) for e in grid])

    def compute(self) -> BudgetResult:
        """Epsilon curves and the required sigma (slow the first time: accountant calls)."""
        return bounded_cache(self._results, self.key(), self._compute, limit=512)

    def _compute(self) -> BudgetResult:
        grid = self.epoch_grid()
        eps = self._curve(self.noise_multiplier, grid)
        error, required, required_eps = "", float("nan"), np.full(len(grid), np.nan)
        try:
            required = get_noise_multiplier(
                target_epsilon=self.target_epsilon,
                target_delta=self.delta,
                sample_rate=self.sample_rate,
                epochs=self.epochs,
                accountant=self.accountant,
            )
            required_eps = self._curve(required, grid)
        except ValueError as exc:
            error = str(exc)
        return BudgetResult(grid, eps, float(eps[-1]), required, required_eps, error)
