"""Noise and clipping schedulers: change sigma or C between epochs, as learning-rate schedulers do.

Each ``step()`` sets the optimizer's ``noise_multiplier`` (or ``max_grad_norm``); the accountant reads
sigma at every step. ``state_dict`` holds everything but the optimizer and a ``lambda``.

>>> import torch
>>> from torch import nn
>>> from dpnotebook.privacy import DPOptimizer
>>> opt = DPOptimizer(torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1), noise_multiplier=2.0,
...                   max_grad_norm=1.0, expected_batch_size=8, secure_mode=False)
>>> scheduler = StepNoise(opt, step_size=2, gamma=0.5)
>>> sigmas = []
>>> for epoch in range(4):
...     sigmas.append(opt.noise_multiplier)
...     scheduler.step()
>>> sigmas
[2.0, 2.0, 1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _Scheduler:
    """Sets ``optimizer.<knob>`` to :meth:`value` on every :meth:`step` (and once on construction)."""

    knob = ""

    def __init__(self, optimizer: Any, *, last_epoch: int = -1) -> None:
        if not hasattr(optimizer, self.knob):
            raise ValueError(
                f"{type(self).__name__} needs an optimizer with .{self.knob}, got {type(optimizer).__name__}. "
                "Fix: pass the DPOptimizer that make_private returned."
            )
        self.optimizer = optimizer
        self.last_epoch = last_epoch
        self.step()

    def value(self, current: float) -> float:
        raise NotImplementedError

    def step(self) -> None:
        """Set the knob to :meth:`value` (per-layer bounds are scaled together, keeping their proportions)."""
        self.last_epoch += 1
        current = getattr(self.optimizer, self.knob)
        new, bounds = self.value(current), getattr(self.optimizer, f"{self.knob}s", None)
        setattr(self.optimizer, self.knob, [b * new / current for b in bounds] if bounds else new)

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state and the knob's value now (``load_state_dict`` sets it again)."""
        value = getattr(self.optimizer, f"{self.knob}s", None) or getattr(self.optimizer, self.knob)
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)} | {"knob_value": value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state, and the optimizer's knob to the value it had reached (a resumed run goes on from it)."""
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "knob_value"})
        if "knob_value" in state_dict:  # absent from older checkpoints
            setattr(self.optimizer, self.knob, state_dict["knob_value"])


class _Exponential(_Scheduler):
    def __init__(self, optimizer: Any, *, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch=last_epoch)

    def value(self, current: float) -> float:
        return current if self.last_epoch == 0 else current * self.gamma


class _Step(_Scheduler):
    def __init__(self, optimizer: Any, *, step_size: int, gamma: float, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch=last_epoch)

    def value(self, current: float) -> float:
        return current if self.last_epoch == 0 or self.last_epoch % self.step_size else current * self.gamma


class _Lambda(_Scheduler):
    def __init__(self, optimizer: Any, function: Callable[[int], float], last_epoch: int) -> None:
        self.function = function
        self.base = getattr(optimizer, self.knob)
        super().__init__(optimizer, last_epoch=last_epoch)

    def value(self, current: float) -> float:
        return self.base * self.function(self.last_epoch)


class ExponentialNoise(_Exponential):
    """Multiply ``noise_multiplier`` by ``gamma`` every epoch."""

    knob = "noise_multiplier"


class StepNoise(_Step):
    """Multiply ``noise_multiplier`` by ``gamma`` every ``step_size`` epochs."""

    knob = "noise_multiplier"


class LambdaNoise(_Lambda):
    """``noise_multiplier = base * noise_lambda(epoch)``."""

    knob = "noise_multiplier"

    def __init__(self, optimizer: Any, *, noise_lambda: Callable[[int], float], last_epoch: int = -1) -> None:
        super().__init__(optimizer, noise_lambda, last_epoch)


class ExponentialGradClip(_Exponential):
    """Multiply ``max_grad_norm`` by ``gamma`` every epoch."""

    knob = "max_grad_norm"


class StepGradClip(_Step):
    """Multiply ``max_grad_norm`` by ``gamma`` every ``step_size`` epochs."""

    knob = "max_grad_norm"


class LambdaGradClip(_Lambda):
    """``max_grad_norm = base * scheduler_function(epoch)``."""

    knob = "max_grad_norm"

    def __init__(self, optimizer: Any, *, scheduler_function: Callable[[int], float], last_epoch: int = -1) -> None:
        super().__init__(optimizer, scheduler_function, last_epoch)
