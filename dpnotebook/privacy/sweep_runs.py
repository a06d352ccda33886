"""The records of a privacy-utility sweep: what one run was asked to do, and what it gave.

A :class:`RunSetting` holds one run's hyper-parameters (the privacy budget or
sigma, the batch size, the epochs, ...); :func:`~dpnotebook.privacy.sweep.train_run`
turns it into a :class:`RunResult`. :func:`noise_on_average` is the number that
compares runs at different batch sizes.

>>> setting = RunSetting(epsilon=2.0, batch_size=32)
>>> setting.private, setting.with_(epsilon=None).private
(True, False)
>>> RunResult(setting, seed=0, accuracy=0.9, epsilon=2.0, noise_multiplier=1.6, steps=100, seconds=1.0).noise_on_average
0.05
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpnotebook.privacy._arguments import check_positive_int, check_positive_number

__all__ = ["RunSetting", "RunResult", "noise_on_average"]


@dataclass(frozen=True)
class RunSetting:
    """The hyper-parameters of one run.

    Attributes:
        epsilon: the target epsilon (sigma is calibrated for it); ``None`` with
            ``noise_multiplier=None`` trains without privacy (no clipping, no noise).
        noise_multiplier: sigma, given directly instead of ``epsilon``.
        batch_size: the expected batch size ``q * N``.
        epochs: passes over the data, in expectation (``ceil(epochs * round(1/q))`` steps).
        max_grad_norm: the clipping bound C.
        lr: the SGD learning rate.
        momentum: SGD momentum.
        delta: the delta of the budget.
        hidden: the MLP's hidden width.
        num_classes: its outputs.
        accountant: ``"pld"`` or ``"rdp"``.
    """

    epsilon: float | None = None
    noise_multiplier: float | None = None
    batch_size: int = 64
    epochs: float = 10
    max_grad_norm: float = 1.0
    lr: float = 0.5
    momentum: float = 0.0
    delta: float = 1e-5
    hidden: int = 32
    num_classes: int = 10
    accountant: str = "pld"

    def __post_init__(self) -> None:
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ValueError(
                f"epsilon={self.epsilon!r} and noise_multiplier={self.noise_multiplier!r}: give one of them "
                "(sigma is calibrated for epsilon), or neither for a non-private run."
            )
        check_positive_int("batch_size", self.batch_size)
        check_positive_number("epochs", self.epochs)
        check_positive_number("lr", self.lr)

    @property
    def private(self) -> bool:
        """Whether the run clips and adds noise."""
        return self.epsilon is not None or self.noise_multiplier is not None

    def with_(self, **changes: Any) -> RunSetting:
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True)
class RunResult:
    """What one run gave.

    Attributes:
        setting: its :class:`RunSetting`.
        seed: seeds the model's initialisation, the batches and the noise.
        accuracy: on the test tensors.
        epsilon: what the accountant says the run spent at ``setting.delta`` (``inf`` without privacy).
        noise_multiplier: sigma (0 without privacy).
        steps: the steps taken.
        seconds: the wall time of the training.
        trained_parameters: ``d``, the number of parameters trained (the noise has ``d`` coordinates).
        clipped_sum_norm: the mean, over the steps, of the norm of the clipped sum (the signal;
            from the optimizer's :class:`~dpnotebook.privacy.step_stats.StepStats`; 0 without privacy).
        noise_norm: the mean norm of the noise added to it (about ``sigma * C * sqrt(d)``).
    """

    setting: RunSetting
    seed: int
    accuracy: float
    epsilon: float
    noise_multiplier: float
    steps: int
    seconds: float
    trained_parameters: int = 0
    clipped_sum_norm: float = 0.0
    noise_norm: float = 0.0

    @property
    def noise_on_average(self) -> float:
        """``sigma * C / B``: the std of the noise on each coordinate of the averaged gradient."""
        return noise_on_average(self.noise_multiplier, self.setting.max_grad_norm, self.setting.batch_size)


def noise_on_average(noise_multiplier: float, max_grad_norm: float, batch_size: float) -> float:
    """``sigma * C / B``: DP-SGD adds ``N(0, (sigma C)^2)`` to the clipped sum and divides by ``B``.

    Each clipped gradient has norm at most ``C``, so the signal in the average is
    at most ``C`` while this noise shrinks as ``B`` grows: at a fixed ``C`` the
    ratio ``sigma / B`` is what decides how noisy a step is.

    >>> noise_on_average(2.0, 1.0, 64)
    0.03125
    """
    return noise_multiplier * max_grad_norm / batch_size
