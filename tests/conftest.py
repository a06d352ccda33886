"""Shared test set-up: every test starts from the same random state."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
