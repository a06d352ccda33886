"""What :class:`~dpnotebook.privacy.engine.PrivacyEngine` reads off its inputs: the wrapped model, q, the optimizer's parameters."""

from __future__ import annotations

import warnings
from typing import Protocol, cast

from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnotebook.errors import PrivacyWarning
from dpnotebook.grad_sample._engine.hooks import GradSampleModule
from dpnotebook.privacy.data_loader import DPDataLoader

__all__ = [
    "is_wrapped",
    "unwrap_model",
    "as_wrapper",
    "GradSampleWrapper",
    "sample_rate_of",
    "check_optimizer_params",
    "warn_not_poisson",
]


class GradSampleWrapper(Protocol):
    """What every mode's grad-sample wrapper has; they share no base class but ``nn.Module``."""

    _module: nn.Module

    def to_standard_module(self) -> nn.Module: ...

    def allow_grad_accumulation(self) -> None: ...


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module`` is a grad-sample wrapper (from :func:`dpnotebook.wrap_model`, any mode)."""
    return isinstance(module, GradSampleModule) or callable(getattr(type(module), "to_standard_module", None))


def unwrap_model(module: nn.Module) -> nn.Module:
    """The original model inside a grad-sample wrapper (or ``module`` itself).

    >>> from torch import nn
    >>> from dpnotebook import wrap_model
    >>> layer = nn.Linear(2, 2)
    >>> unwrap_model(wrap_model(layer, "hooks")) is layer, unwrap_model(layer) is layer
    (True, True)
    """
    return cast(GradSampleWrapper, module)._module if is_wrapped(module) else module


def as_wrapper(module: nn.Module) -> GradSampleWrapper:
    """``module``, a wrapper from :func:`dpnotebook.wrap_model` (any mode), typed as one."""
    assert is_wrapped(module), f"{type(module).__name__} is not a grad-sample wrapper"
    return cast(GradSampleWrapper, module)


def sample_rate_of(data_loader: DataLoader) -> float:
    """q of a data loader: its own for a :class:`DPDataLoader`, else ``1 / len(data_loader)`` (in samples)."""
    return data_loader.sample_rate if isinstance(data_loader, DPDataLoader) else 1 / len(data_loader)


def check_optimizer_params(module: nn.Module, optimizer: Optimizer) -> None:
    """Raise if the optimizer updates a parameter that is not ``module``'s."""
    own = {id(p) for p in module.parameters()}
    strangers = [
        f"param_groups[{g}]['params'][{i}] (shape {tuple(p.shape)})"
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
        if id(p) not in own
    ]
    if strangers:
        raise ValueError(
            f"optimizer holds {len(strangers)} parameter(s) that are not the model's: {', '.join(strangers)}. "
            "They would be updated without clipping or noise. Fix: build the optimizer from "
            "module.parameters() of the very model passed as module=."
        )


def warn_not_poisson(sample_rate: float) -> None:
    """The :class:`~dpnotebook.errors.PrivacyWarning` of ``make_private(poisson_sampling=False)``: ε is not a bound."""
    warnings.warn(
        "poisson_sampling=False: the data loader's shuffled, fixed-size batches are kept, but "
        "the accountant computes epsilon as if every example were in each batch independently "
        f"with probability q={sample_rate:.4g} (Poisson sampling). That epsilon is not a bound "
        "for this run. Fix: poisson_sampling=True (the default), which replaces the loader by "
        "a DPDataLoader.",
        PrivacyWarning,
        stacklevel=3,  # the line that called make_private
    )
