"""Training-loop surfaces for the sensitivity auditor: how a user drives the DP step, not how a layer forms it.

:func:`~dpnotebook.audit.sensitivity.audit_sensitivity` measures the clipped sum a
DP optimizer forms. Some ways of *using* the optimizer have broken the
guarantee around that sum: a parameter frozen between ``backward()`` and
``step()`` (its raw gradient applied), two DP optimizers on one model (a
sample moves each one's half of the step by ``C``), a clipping scheduler
stepped inside a logical batch (pieces clipped at one ``C``, noise for
another). A :class:`Surface` runs one real training step through the public
API (``make_private``, ``BatchMemoryManager``, the schedulers), with σ = 0,
``lr = 1`` and ``loss_reduction="sum"``, so the parameter update *is* the step.

:func:`audit_surface` measures, for every sample ``s``, how far it moves that
update: ``||update(D) - update(D')|| / C`` where ``D'`` keeps the batch (and its
size) and sets ``s``'s loss weight to 0, so that no count check can refuse the
neighbour. ``C`` is the bound the step's noise is calibrated to. Each surface
must now either keep that bound or be refused with its documented error
(:attr:`Surface.refusal`); ``tests/audit/test_surfaces.py`` checks both for every mode.

>>> report = audit_surface("freeze_after_backward", "hooks")
Traceback (most recent call last):
...
RuntimeError: DP step refused: parameter '0.weight' has requires_grad=False but holds a .grad ...
>>> sorted(SURFACES)
['clip_scheduler_in_batch_memory', 'freeze_after_backward', 'two_make_private']
>>> surface_matches("freeze_after_backward", "ghost") is None   # ghost keeps the bound (no raw .grad)
True
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.audit.sensitivity import SensitivityReport
from dpnotebook.mode_registry import optimizer_class
from dpnotebook.modes import wrap_model

__all__ = ["Surface", "SURFACES", "audit_surface", "surface_matches"]

#: The samples of the audited batch; sample 0 is the adversarial one (inputs x 100: a gradient far above C).
B = 4

#: The clipping bound of the surfaces (every sample is clipped).
C = 0.01

#: ``step(mode, x, weights) -> (parameter update, the C the step's noise was calibrated to)``.
Step = Callable[[str, Tensor, Tensor], tuple[Tensor, float]]


@dataclass(frozen=True)
class Surface:
    """One way of driving a DP step, and the error the library raises if it refuses it.

    Attributes:
        name: the key in :data:`SURFACES`.
        description: what the training loop does.
        step: runs one step; returns the flat parameter update and the ``C`` of its noise.
        refusal: ``(error type, message pattern)`` the library raises when it refuses the surface.
    """

    name: str
    description: str
    step: Step
    refusal: tuple[type[BaseException], str]


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _data() -> Tensor:
    x = torch.randn(B, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0] *= 100.0
    return x


def _loss(model: nn.Module, x: Tensor, weights: Tensor) -> Tensor:
    """Each sample's loss times its weight, summed (``loss_reduction="sum"``)."""
    return (weights * model(x).pow(2).sum(-1)).sum()


def _flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _engine_step_setup(
    mode: str, model: nn.Module, params: list[nn.Parameter], x: Tensor, weights: Tensor, engine: object = None
) -> tuple[nn.Module, object, DataLoader]:
    """``make_private`` over ``params`` with the whole batch as one fixed batch (σ = 0, sum, lr = 1)."""
    from dpnotebook.privacy import PrivacyEngine

    loader = DataLoader(TensorDataset(x, weights), batch_size=B)
    engine = engine or PrivacyEngine(secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # poisson_sampling=False: the batch is fixed on purpose
        wrapped, optimizer, loader = engine.make_private(  # type: ignore[attr-defined]
            module=model,
            optimizer=torch.optim.SGD(params, lr=1.0),
            data_loader=loader,
            noise_multiplier=0.0,
            max_grad_norm=C,
            grad_sample_mode=mode,
            loss_reduction="sum",
            poisson_sampling=False,
        )
    return wrapped, optimizer, loader


def freeze_after_backward(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``backward()``, then ``model[0].weight.requires_grad_(False)``, then ``step()``."""
    model = _model()
    wrapped = wrap_model(model, mode, loss_reduction="sum")
    optimizer = optimizer_class(mode)(
        torch.optim.SGD(model.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=1.0,
        loss_reduction="sum",
        secure_mode=False,
    )
    before = _flat(model)
    optimizer.zero_grad()
    _loss(wrapped, x, weights).backward()
    model[0].weight.requires_grad_(False)
    optimizer.step()
    return _flat(model) - before, C


def two_make_private(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``make_private`` twice on one model (one optimizer per half of the parameters), both stepped."""
    model = _model()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    wrapped, opt1, _ = _engine_step_setup(mode, model, first, x, weights)
    wrapped, opt2, _ = _engine_step_setup(mode, wrapped, second, x, weights)
    before = _flat(model)
    opt1.zero_grad()  # type: ignore[attr-defined]
    opt2.zero_grad()  # type: ignore[attr-defined]
    _loss(wrapped, x, weights).backward()
    opt1.step()  # type: ignore[attr-defined]
    opt2.step()  # type: ignore[attr-defined]
    return _flat(model) - before, C


def clip_scheduler_in_batch_memory(mode: str, x: Tensor, weights: Tensor) -> tuple[Tensor, float]:
    """``ExponentialGradClip(gamma=0.5)`` stepped after every physical step of ``BatchMemoryManager``."""
    from dpnotebook.privacy import BatchMemoryManager, ExponentialGradClip

    model = _model()
    wrapped, optimizer, loader = _engine_step_setup(mode, model, list(model.parameters()), x, weights)
    scheduler = ExponentialGradClip(optimizer, gamma=0.5)
    noise_bounds: list[float] = []
    optimizer.attach_step_hook(lambda opt: noise_bounds.append(opt.max_grad_norm))  # type: ignore[attr-defined]
    before = _flat(model)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=1, optimizer=optimizer) as batches:  # type: ignore[arg-type]
        for xb, wb in batches:
            optimizer.zero_grad()  # type: ignore[attr-defined]
            _loss(wrapped, xb, wb).backward()
            optimizer.step()  # type: ignore[attr-defined]
            scheduler.step()
    return _flat(model) - before, noise_bounds[-1]


#: The surfaces, by name.
SURFACES: dict[str, Surface] = {
    s.name: s
    for s in (
        Surface(
            "freeze_after_backward",
            "a parameter frozen between backward() and step(): its raw .grad must not be applied",
            freeze_after_backward,
            (RuntimeError, r"requires_grad=False but holds a \.grad"),
        ),
        Surface(
            "two_make_private",
            "make_private twice on one model, one optimizer per half of the parameters, both stepped",
            two_make_private,
            (RuntimeError, r"already has a DP optimizer"),
        ),
        Surface(
            "clip_scheduler_in_batch_memory",
            "a clipping scheduler stepped after each physical step of BatchMemoryManager",
            clip_scheduler_in_batch_memory,
            (RuntimeError, r"changed while a logical batch is accumulated"),
        ),
    )
}


def audit_surface(name: str, mode: str) -> SensitivityReport:
    """``||update(D) - update(D')|| / C`` for every sample, ``D'``: that sample's loss weight set to 0.

    Args:
        name: a key of :data:`SURFACES`.
        mode: a grad-sample mode (:func:`dpnotebook.available_modes`).

    Returns:
        A :class:`~dpnotebook.audit.sensitivity.SensitivityReport` (``movers`` name no parameter here).
        An error the library raises (a refusal) propagates.

    Raises:
        KeyError: ``name`` is not a surface; the message lists them.
    """
    if name not in SURFACES:
        raise KeyError(f"surface {name!r} is unknown; choose one of {sorted(SURFACES)}.")
    surface = SURFACES[name]
    x = _data()
    full, bound = surface.step(mode, x, torch.ones(B, dtype=torch.float64))
    report = SensitivityReport({"surface": name, "mode": mode, "C": bound})
    for s in range(B):
        weights = torch.ones(B, dtype=torch.float64)
        weights[s] = 0.0
        update, _ = surface.step(mode, x, weights)
        report.ratios.append(float((full - update).norm()) / bound)
        report.movers.append("all parameters")
    return report


def surface_matches(name: str, mode: str) -> str | None:
    """``None`` if the surface is refused with its documented error or keeps the bound in ``mode``, else what broke.

    Args:
        name: a key of :data:`SURFACES`.
        mode: a grad-sample mode.
    """
    types, pattern = SURFACES[name].refusal
    try:
        report = audit_surface(name, mode)
    except types as error:
        return None if re.search(pattern, str(error)) else f"refused with {error!r}; expected /{pattern}/"
    except Exception as error:  # noqa: BLE001 - any other error is a finding to report, not a crash
        return f"raised {type(error).__name__}: {error}"
    return None if report.ok() else f"sensitivity over C:\n{report}"
