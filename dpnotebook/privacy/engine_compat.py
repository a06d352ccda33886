"""The parts of Opacus' ``PrivacyEngine`` surface that :class:`~dpnotebook.privacy.engine.PrivacyEngine` delegates here.

Each function is a thin translation of an Opacus spelling to dpnotebook's own
machinery, or a refusal by design whose message says why and what to use
instead (``docs/migration-from-opacus.md`` lists them all):

* ``criterion=`` with ``grad_sample_mode="ghost"``: the criterion is wrapped in a
  :class:`~dpnotebook.privacy.ghost_loss.DPLossFastGradientClipping`;
* ``wrap_model=False``, ``clipping="adaptive"``, ``rand_on_empty=True``,
  ``accountant="gdp"``: refused with :class:`~dpnotebook.errors.UnsupportedOptionError`
  (a ``ValueError`` and a ``NotImplementedError``);
* checkpoints: :mod:`~dpnotebook.privacy.checkpoints`.

>>> refuse_unsupported(wrap_model=False, clipping="flat", rand_on_empty=False, extra={})
Traceback (most recent call last):
...
dpnotebook.errors.UnsupportedOptionError: wrap_model=False is not supported: ...
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.errors import UnsupportedOptionError

__all__ = [
    "ADAPTIVE_CLIPPING_ARGS",
    "refuse_unsupported",
    "check_accountant_name",
    "ghost_criterion",
    "compatible_module",
    "problems_of",
    "raise_problems",
]

#: The keyword arguments of Opacus' adaptive clipping (``AdaClipDPOptimizer``).
ADAPTIVE_CLIPPING_ARGS = (
    "target_unclipped_quantile",
    "clipbound_learning_rate",
    "max_clipbound",
    "min_clipbound",
    "unclipped_num_std",
)


def refuse_unsupported(*, wrap_model: bool, clipping: str, rand_on_empty: bool, extra: dict[str, Any]) -> None:
    """Raise for the Opacus options of ``make_private`` that dpnotebook refuses by design, or does not know."""
    if not wrap_model:
        raise UnsupportedOptionError(
            "wrap_model=False is not supported: dpnotebook's per-sample gradients are checked in the wrapper's "
            "forward (rows per layer, parameters used outside their layer), which hooks on the bare model "
            "cannot do. Fix: use the returned module (it forwards attribute access to your model; "
            "model.to_standard_module() gives the plain model back) and drop wrap_model=False."
        )
    if clipping == "adaptive" or any(k in extra for k in ADAPTIVE_CLIPPING_ARGS):
        raise UnsupportedOptionError(
            "clipping='adaptive' (Opacus' AdaClipDPOptimizer) is not supported: its noisy count of unclipped "
            "samples spends privacy that dpnotebook's accountant does not record yet. Fix: use "
            "clipping='flat' (or 'per_layer') with a fixed max_grad_norm, or a grad-clip scheduler "
            "(dpnotebook.schedulers) that changes it between epochs."
        )
    if rand_on_empty:
        raise UnsupportedOptionError(
            "rand_on_empty=True is not supported: an empty Poisson batch comes out as zero-row tensors and "
            "every grad-sample mode handles it (a noise-only step). Fix: drop rand_on_empty."
        )
    if extra:
        raise TypeError(
            f"make_private() got unexpected keyword argument(s) {sorted(extra)}. "
            "See docs/migration-from-opacus.md for the arguments dpnotebook accepts."
        )


def check_accountant_name(accountant: str) -> str:
    """``accountant`` unchanged, or a refusal for Opacus' ``"gdp"``.

    >>> check_accountant_name("gdp")
    Traceback (most recent call last):
    ...
    dpnotebook.errors.UnsupportedOptionError: accountant='gdp' is not supported: ...
    """
    if accountant == "gdp":
        raise UnsupportedOptionError(
            "accountant='gdp' is not supported: Opacus' Gaussian (GDP) accountant uses a central-limit "
            "approximation that can report less epsilon than the run spent, and dpnotebook only reports "
            "bounds. Fix: choose one of ['pld', 'prv', 'rdp'] ('prv' and 'pld' are tight)."
        )
    return accountant


def ghost_criterion(module: nn.Module, optimizer: Any, criterion: Any, loss_reduction: str) -> Any:
    """Opacus' ``DPLossFastGradientClipping`` around ``criterion`` for a ghost-mode ``module``."""
    from dpnotebook.privacy.ghost_loss import DPLossFastGradientClipping

    return DPLossFastGradientClipping(module, optimizer, criterion, loss_reduction)


def compatible_module(module: nn.Module) -> nn.Module:
    """Opacus' ``get_compatible_module``: ``ModuleValidator.fix_and_validate`` (a repaired copy, checked strictly).

    BatchNorm becomes ``GroupNorm(gcd(32, C), C)`` as in Opacus, so the model is the one
    an Opacus user gets (see :mod:`dpnotebook.validators.module_validator`).

    >>> from torch import nn
    >>> compatible_module(nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4)))[1]
    GroupNorm(4, 4, eps=1e-05, affine=True...)
    """
    from dpnotebook.validators.module_validator import ModuleValidator

    return ModuleValidator.fix_and_validate(module)


def problems_of(module: nn.Module) -> list:
    """What :func:`dpnotebook.validate` finds in ``module`` (hooks mode, as Opacus' ``ModuleValidator``)."""
    from dpnotebook.validation import validate

    return validate(module)


def raise_problems(module: nn.Module) -> None:
    """Raise :class:`~dpnotebook.errors.UnsupportedModuleError` listing every problem of ``module``."""
    from dpnotebook.validation import raise_if_problems

    raise_if_problems(problems_of(module))
