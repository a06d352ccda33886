"""Shared pieces of the Opacus-style user scripts: generated data and models, and the import switch."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def lib(name: str, path: str = "") -> ModuleType:
    """``import opacus.<path>`` or ``import dpnotebook.<path>``: the only line a user changes."""
    return import_module(f"{name}.{path}" if path else name)


def dataset(n: int = 64, features: int = 5, classes: int = 3, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


def mlp(features: int = 5, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, classes))


def loader(data: TensorDataset, batch_size: int = 16, **kwargs) -> DataLoader:
    return DataLoader(data, batch_size=batch_size, **kwargs)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])
