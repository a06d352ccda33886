"""Widget tests run headless: the Agg backend, no display, no kernel."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn


@pytest.fixture
def fignums():
    """Assert at the end of the test that no pyplot figure was opened."""
    before = list(plt.get_fignums())
    yield before
    assert plt.get_fignums() == before


@pytest.fixture
def small_model_batch():
    """A small conv net, a batch of 12 and a loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))
    batch = (torch.randn(12, 1, 6, 6), torch.randint(0, 4, (12,)))
    return model, batch, nn.functional.cross_entropy


def _boom(*args, **kwargs):
    raise RuntimeError("boom from a plot update")


@pytest.fixture
def boom():
    """A plotting function that fails, to test that callback errors are shown."""
    return _boom
