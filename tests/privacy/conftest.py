"""Privacy tests run single-threaded: the models are tiny, and on a busy 2-core
machine thread synchronisation costs more than it saves. Restored afterwards."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
