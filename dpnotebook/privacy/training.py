"""Training and evaluation loops shared by the examples and tutorials.

They work with a private setup (from :meth:`PrivacyEngine.make_private
<dpnotebook.privacy.engine.PrivacyEngine.make_private>`) and with a plain one,
so the non-private baseline runs the very same code.

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

from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from dpnotebook.privacy.engine import unwrap_model

__all__ = ["train_epoch", "fit", "evaluate"]

LossFn = Callable[[Tensor, Tensor], Tensor]


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def train_epoch(
    model: nn.Module,
    optimizer: Optimizer,
    data_loader: DataLoader,
    *,
    loss_fn: LossFn = F.cross_entropy,
    progress: tqdm | None = None,
) -> float:
    """One pass over ``data_loader``; returns the mean loss over the non-empty batches.

    An empty batch (possible with Poisson sampling) skips the forward pass but
    still calls ``optimizer.step()``: a DP optimizer then adds noise only, and
    the accountant counts the step, as the privacy analysis requires.

    Args:
        model: the model (wrapped or plain).
        optimizer: a :class:`~dpnotebook.privacy.optimizer.DPOptimizer` or any optimizer.
        data_loader: yields ``(inputs, targets)``, moved to the model's device here.
        loss_fn: ``loss_fn(outputs, targets)``, reducing as the model's wrapper was told.
        progress: a tqdm bar to advance by one per batch.
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
                progress.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return sum(losses) / len(losses) if losses else float("nan")


def fit(
    model: nn.Module,
    optimizer: Optimizer,
    data_loader: DataLoader,
    *,
    epochs: int,
    loss_fn: LossFn = F.cross_entropy,
    progress: bool = True,
    description: str = "training",
) -> list[float]:
    """``epochs`` calls of :func:`train_epoch` under one tqdm progress bar; returns each epoch's mean loss."""
    with tqdm(total=epochs * len(data_loader), desc=description, disable=not progress, leave=False) as bar:
        return [train_epoch(model, optimizer, data_loader, loss_fn=loss_fn, progress=bar) for _ in range(epochs)]


@torch.no_grad()
def evaluate(model: nn.Module, data_loader: DataLoader) -> float:
    """The accuracy of ``model`` (unwrapped, in eval mode) on ``data_loader``'s ``(inputs, labels)``.

    Batches are moved to the model's device, so a model on the GPU works with a CPU data loader.
    """
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
