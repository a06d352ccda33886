"""``BatchMemoryManager``: big logical batches, small physical ones (Opacus' API).

DP-SGD likes large batches (the noise is divided by the batch size), but the
per-sample gradients of a large batch may not fit in memory. The manager
cuts every logical batch into physical pieces; the optimizer's step on each
piece but the last only clips and accumulates (a virtual step), and the step
on the last piece adds the noise once and updates the model.

>>> import torch
>>> from torch import nn
>>> from torch.utils.data import TensorDataset
>>> import dpnotebook
>>> from dpnotebook.privacy import DPDataLoader, DPOptimizer
>>> model = dpnotebook.wrap_model(nn.Linear(2, 1), "hooks")
>>> loader = DPDataLoader(TensorDataset(torch.randn(40, 2)), sample_rate=0.5,
...                       generator=torch.Generator().manual_seed(0))
>>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
...                   max_grad_norm=1.0, expected_batch_size=20)
>>> with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as batches:
...     for (x,) in batches:
...         opt.zero_grad()
...         model(x).sum().backward()
...         opt.step()
>>> opt.last_step_stats.virtual_steps > 1, len(batches)   # ceil(2 batches * 20 expected / 8)
(True, 5)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from torch.utils.data import DataLoader

import dpnotebook.privacy.optimizer
from dpnotebook.privacy.arguments import check_positive_int
from dpnotebook.privacy.augmult import loader_k
from dpnotebook.privacy.data_loader import split_batch
from dpnotebook.privacy.optimizer import DPOptimizer

__all__ = ["BatchMemoryManager"]


class BatchMemoryManager:
    """Context manager yielding physical batches of at most ``max_physical_batch_size`` samples.

    Args:
        data_loader: yields logical batches (e.g. a :class:`DPDataLoader`).
        max_physical_batch_size: the most samples per physical batch.
        optimizer: the :class:`~dpnotebook.privacy.optimizer.DPOptimizer` to tell which steps are virtual.
        K: rows per sample (default: the data loader's augmentation multiplicity).
    """

    def __init__(
        self,
        *,
        data_loader: DataLoader,
        max_physical_batch_size: int,
        optimizer: dpnotebook.privacy.optimizer.DPOptimizer,
        K: int | None = None,
    ) -> None:
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be a DPOptimizer, got {type(optimizer).__name__}.")
        self.data_loader = data_loader
        self.max_physical_batch_size = check_positive_int("max_physical_batch_size", max_physical_batch_size)
        self.optimizer = optimizer
        self.K = (loader_k(data_loader) or 1) if K is None else check_positive_int("K", K)

    def _batches(self) -> Iterator[Any]:
        for batch in self.data_loader:
            pieces = list(split_batch(batch, max_physical_batch_size=self.max_physical_batch_size, K=self.K))
            pieces = pieces or [batch]  # an empty batch is still one (noise-only) step
            for i, piece in enumerate(pieces):
                self.optimizer.signal_skip_step(i < len(pieces) - 1)
                yield piece

    def __enter__(self) -> PhysicalBatches:
        return PhysicalBatches(self)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.optimizer.signal_skip_step(False)


class PhysicalBatches:
    """What ``with BatchMemoryManager(...) as batches`` gives: the physical batches, and their expected number.

    ``len()`` is Opacus': ``ceil(logical batches * expected batch size / max_physical_batch_size)``
    (the Poisson batch sizes vary, so a pass may yield a few more or fewer).
    """

    def __init__(self, manager: BatchMemoryManager) -> None:
        self.manager = manager

    def __iter__(self) -> Iterator[Any]:
        return self.manager._batches()

    def __len__(self) -> int:
        loader = self.manager.data_loader
        expected = getattr(loader, "expected_batch_size", None) or loader.batch_size or 1
        return math.ceil(len(loader) * expected / self.manager.max_physical_batch_size)
