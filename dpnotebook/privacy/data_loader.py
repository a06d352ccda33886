"""Data loading for DP-SGD: Poisson sampling and physical batches.

The privacy analysis of DP-SGD assumes **Poisson sampling**: for every batch,
each of the ``N`` samples is included independently with probability
``q = expected_batch_size / N``. Batch sizes therefore vary, and a batch can
be empty; an empty batch still counts as a step (it adds noise only), and it
comes out as zero-length tensors of the right shapes and dtypes so the
training loop needs no special case.

>>> import torch
>>> from torch.utils.data import TensorDataset
>>> data = TensorDataset(torch.randn(100, 3), torch.arange(100))
>>> loader = DPDataLoader(data, sample_rate=0.1, generator=torch.Generator().manual_seed(0))
>>> len(loader), loader.expected_batch_size
(10, 10.0)
>>> [len(y) for x, y in loader]
[6, 10, 5, 7, 14, 7, 10, 9, 8, 12]
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data.dataloader import default_collate

from dpnotebook.privacy._accounting import steps_per_epoch
from dpnotebook.privacy._mechanisms import secure_uniform
from dpnotebook.privacy.arguments import check_positive_int, check_sample_rate
from dpnotebook.privacy.draws import DrawMarker

__all__ = ["PoissonBatchSampler", "DPDataLoader", "EmptyBatchCollate", "split_batch"]

Collate = Callable[[list], Any]


def _map_columns(batch: Any, index: slice) -> Any:
    """Apply ``index`` (a slice of rows) to every tensor, and every list of plain items, in ``batch``."""
    if isinstance(batch, Tensor):
        return batch[index]
    if isinstance(batch, Mapping):
        return {k: _map_columns(v, index) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and all(isinstance(b, (Tensor, Mapping, tuple, list)) for b in batch):
        items = [_map_columns(b, index) for b in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, list):
        return batch[index]
    return batch


def _num_rows(batch: Any) -> int:
    """The number of rows (dim 0) of the first tensor in ``batch``."""
    if isinstance(batch, Tensor):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, Mapping) else batch
    for value in values:
        if isinstance(value, (Tensor, Mapping, tuple, list)):
            return _num_rows(value)
    raise ValueError("The batch holds no tensor, so it cannot be split into rows.")


class PoissonBatchSampler(Sampler[list[int]]):
    """Yields ``steps`` batches of indices; each index is in a batch with probability ``sample_rate``.

    Args:
        num_samples: the dataset size N.
        sample_rate: q in (0, 1].
        steps: batches per epoch (default ``round(1 / q)``, one epoch in expectation).
        generator: a ``torch.Generator`` (seed it to reproduce the batches).
        secure_mode: draw from the OS CSPRNG instead (no ``generator`` then).
    """

    def __init__(
        self,
        num_samples: int,
        *,
        sample_rate: float,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
    ) -> None:
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.sample_rate = check_sample_rate(sample_rate)
        self.steps = check_positive_int("steps", steps if steps is not None else steps_per_epoch(self.sample_rate))
        if secure_mode and generator is not None:
            raise ValueError(
                f"generator={generator!r} with secure_mode=True: a seeded generator is predictable. "
                "Fix: pass generator=None for secure sampling, or secure_mode=False to reproduce a run."
            )
        self.generator = generator
        self.secure_mode = secure_mode
        #: sizes of the batches drawn and not yet handed out (the loader may prefetch)
        self.drawn: deque[int] = deque()

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        self.drawn.clear()  # a new pass: counts of a pass that broke off are stale
        for _ in range(self.steps):
            if self.secure_mode:
                uniform = secure_uniform(self.num_samples)
            else:
                # float64: float32 uniforms lie on a grid of 2^-24, so `u < q` would include
                # each sample with q rounded up to that grid, not with probability q
                uniform = torch.rand(self.num_samples, generator=self.generator, dtype=torch.float64)
            indices = torch.nonzero(uniform < self.sample_rate).flatten().tolist()
            self.drawn.append(len(indices))
            yield indices


class EmptyBatchCollate:
    """Wraps a ``collate_fn`` so that an empty list of samples gives zero-row tensors.

    The shapes and dtypes are those of ``collate_fn([dataset[0]])`` with its
    rows sliced away, so they match every other batch exactly.
    """

    def __init__(self, collate_fn: Collate, dataset: Dataset) -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset
        self._empty: Any = None

    def __call__(self, samples: list) -> Any:
        if samples:
            return self.collate_fn(samples)
        if self._empty is None:
            self._empty = _map_columns(self.collate_fn([self.dataset[0]]), slice(0, 0))
        return self._empty


class DPDataLoader(DataLoader):
    """A ``DataLoader`` with Poisson sampling (see the module docstring).

    Args:
        dataset: a map-style dataset (with ``len`` and ``dataset[i]``).
        sample_rate: q, the probability that a sample is in a batch.
        collate_fn: turns a list of samples into a batch (default: PyTorch's).
        steps: batches per epoch (default ``round(1 / q)``).
        generator: a ``torch.Generator`` for the sampling.
        secure_mode: sample with the OS CSPRNG.
        **kwargs: other ``DataLoader`` arguments (``num_workers``, ``pin_memory``, ...).

    Attributes:
        sample_rate: q.
        expected_batch_size: ``q * len(dataset)``, in samples.
        batch_listeners: functions called with the number of examples of each batch
            handed out (``make_private`` adds the optimizer's, which checks that each
            step clips the examples of exactly one batch).
        draws: a :class:`~dpnotebook.privacy.draws.DrawMarker`: it marks every tensor of a batch handed
            out with the batch's draw (``draws.last``), so the optimizer can tell where its samples came from.
    """

    #: draws the batches (the distributed loader draws each rank's share of them)
    batch_sampler_class: type[PoissonBatchSampler] = PoissonBatchSampler
    #: the loader ``from_data_loader(distributed=True)`` builds; set by
    #: ``dpnotebook.privacy._distributed``, which the package imports
    distributed_class: type[DPDataLoader]

    def __init__(
        self,
        dataset: Dataset,
        *,
        sample_rate: float,
        collate_fn: Collate | None = None,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError("Poisson sampling needs a map-style dataset (len and dataset[i]), not an IterableDataset.")
        if isinstance(collate_fn, EmptyBatchCollate):
            collate_fn = collate_fn.collate_fn
        size = len(cast(Sized, dataset))  # map-style (not an IterableDataset): it has a len
        sampler = self.batch_sampler_class(
            size, sample_rate=sample_rate, steps=steps, generator=generator, secure_mode=secure_mode
        )
        super().__init__(
            dataset,
            batch_sampler=sampler,
            collate_fn=EmptyBatchCollate(collate_fn or default_collate, dataset),
            **kwargs,
        )
        self.sample_rate = sampler.sample_rate
        self.expected_batch_size = self.sample_rate * size
        self.batch_listeners: list[Callable[[int], None]] = []
        self.draws = DrawMarker()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch: its iterator class; ours wraps it
        """The batches, in order, marked (``draws``); each one's number of examples goes to every ``batch_listeners``.

        Counted when a batch is handed out, not when its indices are drawn: with
        ``num_workers > 0`` the loader draws ahead of the training loop.
        """
        drawn = cast(PoissonBatchSampler, self.batch_sampler).drawn  # __init__'s (a DataLoader's is fixed)
        for batch in super().__iter__():
            examples = drawn.popleft()
            if not examples and not getattr(self, "_warned_empty", False):
                self._warned_empty = True
                warnings.warn(
                    "Poisson sampling drew an empty batch (zero-row tensors): its step adds noise only and "
                    "still counts for privacy. Expected now and then with a small expected batch size "
                    f"({self.expected_batch_size:.3g}); said once per loader.",
                    UserWarning,
                    stacklevel=2,
                )
            self.draws.mark(batch)
            for listener in self.batch_listeners:
                listener(examples)
            yield batch

    @classmethod
    def from_data_loader(
        cls,
        loader: DataLoader,
        *,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        distributed: bool = False,
    ) -> DPDataLoader:
        """The Poisson version of ``loader``: same dataset, collate and workers, ``q = 1 / len(loader)``.

        A :class:`DPDataLoader` keeps its own sample rate and number of steps. Without
        ``generator`` (and ``secure_mode``), the batches are drawn with ``loader.generator``,
        as in Opacus, so a seeded loader gives seeded batches. With
        ``distributed=True`` (``torch.distributed`` initialised) it is a
        :class:`~dpnotebook.privacy.DistributedDPDataLoader`: this rank's
        share of each global Poisson batch, at the same ``q``.

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.randn(60, 2)), batch_size=20)
        >>> dp = DPDataLoader.from_data_loader(loader)
        >>> len(dp), dp.sample_rate, dp.expected_batch_size
        (3, 0.3333333333333333, 20.0)
        """
        if loader.batch_sampler is None:
            raise ValueError("data_loader has batch_size=None (no batching); give it a batch_size.")
        kwargs: dict[str, Any] = {
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "timeout": loader.timeout,
            "worker_init_fn": loader.worker_init_fn,
        }
        if loader.num_workers > 0:
            kwargs.update(
                multiprocessing_context=loader.multiprocessing_context,
                prefetch_factor=loader.prefetch_factor,
                persistent_workers=loader.persistent_workers,
            )
        if generator is None and not secure_mode:
            generator = loader.generator
        if distributed:
            cls = DPDataLoader.distributed_class
        return cls(
            loader.dataset,
            sample_rate=loader.sample_rate if isinstance(loader, DPDataLoader) else 1 / len(loader),
            steps=len(loader),
            collate_fn=loader.collate_fn,
            generator=generator,
            secure_mode=secure_mode,
            **kwargs,
        )


def split_batch(batch: Any, *, max_physical_batch_size: int, K: int = 1) -> Iterator[Any]:
    """Split a logical batch into physical pieces of at most ``max_physical_batch_size`` samples.

    Every tensor (and list) in ``batch`` is cut along dim 0; a sample's ``K``
    rows stay together. An empty batch yields nothing. Use with
    :meth:`DPOptimizer.virtual_step <dpnotebook.privacy.optimizer.DPOptimizer.virtual_step>`::

        for x, y in loader:
            for xb, yb in split_batch((x, y), max_physical_batch_size=32):
                criterion(model(xb), yb).backward()
                optimizer.virtual_step()      # clip this piece, add it to the sum
            optimizer.step()                  # noise once, then the update
            optimizer.zero_grad()

    >>> import torch
    >>> [x.tolist() for x, in split_batch((torch.arange(5),), max_physical_batch_size=2)]
    [[0, 1], [2, 3], [4]]
    """
    size = check_positive_int("max_physical_batch_size", max_physical_batch_size)
    K = check_positive_int("K", K)
    rows = _num_rows(batch)
    if rows % K:
        raise ValueError(
            f"K={K} does not divide the batch's {rows} rows: a batch holds K augmented rows per sample, "
            "sample-major. Fix: pass the K that the data loader uses."
        )
    step = size * K
    for start in range(0, rows, step):
        yield _map_columns(batch, slice(start, start + step))
