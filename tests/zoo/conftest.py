"""One intra-op thread for the zoo's tiny models: on a shared 2-core machine, two threads that wait
for each other make a 12x12 float64 convolution 50x slower than one thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
