"""Shared test set-up: every test starts from the same random state; ``device`` is where the session runs."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device of this run: ``cpu``, or ``cuda`` under ``pytest --device cuda`` (see the root conftest.py)."""
    return torch.device(request.config.getoption("device"))
