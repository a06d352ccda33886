"""Distributed tests: 2 processes on 127.0.0.1 (gloo), each launch bounded by run_on_ranks' timeouts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _on_the_ranks_device(request: pytest.FixtureRequest) -> Iterator[None]:
    """The test's own tensors on the CPU, where the gloo ranks compute.

    The ranks are fresh processes with torch's default device (the CPU). Under ``pytest --device cuda``
    a test's reference (one process trained on the union of the ranks' batches, the untrained model)
    would otherwise be made on the GPU and compared with the ranks' CPU results (the first GPU pass of
    these tests, H200 2026-11-27: 17 such failures). The NCCL tests name their devices themselves.
    """
    if request.path.name == "test_nccl.py":
        yield
        return
    with torch.device("cpu"):
        yield
