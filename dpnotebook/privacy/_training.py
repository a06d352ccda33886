"""Training and evaluation loops, for a private setup and for the plain baseline alike.

>>> import torch
>>> from torch import nn
>>> from torch.utils.data import DataLoader, TensorDataset
>>> _ = torch.manual_seed(0)
>>> data = TensorDataset(torch.randn(64, 2), torch.randint(0, 2, (64,)))
>>> model = nn.Linear(2, 2)
>>> losses = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=16),
...              epochs=2, progress=False)
>>> len(losses), 0 <= evaluate(model, DataLoader(data, batch_size=32)) <= 1
(2, True)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from dpnotebook.privacy._optimizer import unwrap_model

if TYPE_CHECKING:
    from dpnotebook.privacy._engine import PrivacyEngine


LossFn = Callable[[Tensor, Tensor], Tensor]


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def show_progress(progress: bool | None) -> bool:
    """Whether a long loop shows its progress bar: ``progress`` if given, else whether stderr is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def train_epoch(
    model: nn.Module,
    optimizer: Optimizer,
    data_loader: DataLoader[Any],
    *,
    loss_fn: LossFn = F.cross_entropy,
    progress: tqdm | None = None,
    postfix: dict[str, str] | None = None,
) -> float:
    """One pass over ``data_loader``; returns the mean loss over the non-empty batches.

    An empty Poisson batch skips the forward pass but still steps (noise only, counted).

    Args:
        model: the model (wrapped or plain).
        optimizer: a :class:`~dpnotebook.privacy.DPOptimizer` or any optimizer.
        data_loader: yields ``(inputs, targets)``, moved to the model's device.
        loss_fn: ``loss_fn(outputs, targets)``.
        progress: a tqdm bar to advance per batch.
        postfix: more fields for the bar, after the loss.
    """
    model.train()
    device = model_device(model)
    losses = []
    for inputs, targets in data_loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        if len(targets) > 0:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            losses.append(loss.item())
        optimizer.step()
        if progress is not None:
            progress.update(1)
            if losses:
                progress.set_postfix(loss=f"{losses[-1]:.3f}", **(postfix or {}), refresh=False)
    return sum(losses) / len(losses) if losses else float("nan")


def fit(
    model: nn.Module,
    optimizer: Optimizer,
    data_loader: DataLoader[Any],
    *,
    epochs: int,
    loss_fn: LossFn = F.cross_entropy,
    progress: bool = True,
    description: str = "training",
    privacy_engine: PrivacyEngine | None = None,
    delta: float | None = None,
) -> list[float]:
    """``epochs`` calls of :func:`train_epoch` under one tqdm progress bar; returns each epoch's mean loss.

    Args:
        model: the model (wrapped or plain).
        optimizer: a :class:`~dpnotebook.privacy.DPOptimizer` or any optimizer.
        data_loader: yields ``(inputs, targets)``.
        epochs: passes over ``data_loader``.
        loss_fn: ``loss_fn(outputs, targets)``.
        progress: show the bar.
        description: the bar's label.
        privacy_engine: the engine whose epsilon the bar shows, each epoch.
        delta: the delta of that epsilon (required with ``privacy_engine``).

    >>> from torch.utils.data import TensorDataset
    >>> from dpnotebook.privacy._engine import PrivacyEngine
    >>> fit(nn.Linear(2, 2), None, DataLoader(TensorDataset(torch.randn(4, 2))), epochs=1,
    ...     privacy_engine=PrivacyEngine())
    Traceback (most recent call last):
    ...
    ValueError: privacy_engine is given without delta: the bar cannot show epsilon. Fix: pass delta=, ...
    """
    if privacy_engine is not None and delta is None:
        raise ValueError(
            "privacy_engine is given without delta: the bar cannot show epsilon. "
            "Fix: pass delta=, the delta of your guarantee (e.g. delta=1e-5)."
        )
    postfix: dict[str, str] = {}
    losses = []
    with tqdm(total=epochs * len(data_loader), desc=description, disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            if privacy_engine is not None and progress:
                assert delta is not None  # checked above
                postfix["ε"] = f"{privacy_engine.get_epsilon(delta):.3g}"
            losses.append(train_epoch(model, optimizer, data_loader, loss_fn=loss_fn, progress=bar, postfix=postfix))
        if privacy_engine is not None and progress:
            assert delta is not None
            postfix["ε"] = f"{privacy_engine.get_epsilon(delta):.3g}"
            bar.set_postfix(loss=f"{losses[-1]:.3f}", **postfix)
    return losses


@torch.no_grad()
def evaluate(model: nn.Module, data_loader: DataLoader[Any]) -> float:
    """The accuracy of ``model`` (unwrapped, in eval mode) on ``data_loader``'s ``(inputs, labels)``."""
    plain = unwrap_model(model)
    was_training = plain.training
    plain.eval()
    device = model_device(plain)
    correct = total = 0
    for inputs, labels in data_loader:
        inputs, labels = inputs.to(device), labels.to(device)
        correct += (plain(inputs).argmax(dim=1) == labels).sum().item()
        total += len(labels)
    plain.train(was_training)
    return correct / total if total else float("nan")
