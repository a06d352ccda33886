"""Data loading for DP-SGD: Poisson sampling, physical batches and augmentation multiplicity.

The privacy analysis assumes **Poisson sampling**: each of the ``N`` samples joins every batch independently
with probability ``q``. Batch sizes vary; an empty batch is still a (noise-only) step and comes out as
zero-row tensors. :class:`BatchMemoryManager` cuts logical batches into physical pieces;
:class:`AugmultCollate` turns each sample into ``K`` augmented rows (accounting counts samples).

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

import math
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sized
from types import TracebackType
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)
from torch.utils.data.dataloader import default_collate

from dpnotebook.privacy._accounting import steps_per_epoch
from dpnotebook.privacy._arguments import check_positive_int, check_sample_rate, check_unseeded
from dpnotebook.privacy._batches import DrawMarker, _tensors
from dpnotebook.privacy._mechanisms import secure_uniform
from dpnotebook.privacy._optimizer import DPOptimizer

Collate = Callable[[list[Any]], Any]


def _map_columns(batch: Any, index: slice) -> Any:
    """Apply ``index`` (a slice of rows) to every tensor and list of plain items in ``batch``."""
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
    tensors = _tensors(batch)
    if not tensors:
        raise ValueError("The batch holds no tensor, so it cannot be split into rows.")
    return tensors[0].shape[0]


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
        check_unseeded("generator", generator, secure_mode)
        self.generator = generator
        self.secure_mode = secure_mode
        #: sizes of the batches drawn and not yet handed out (the loader may prefetch)
        self.drawn: deque[int] = deque()

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        self.drawn.clear()  # a new pass: counts of a pass that broke off are stale
        for _ in range(self.steps):
            indices = self._draw()
            self.drawn.append(len(indices))
            yield indices

    def _draw(self) -> list[int]:
        """One batch's indices: each sample kept when its uniform is below q."""
        if self.secure_mode:
            uniform = secure_uniform(self.num_samples)
        else:  # float64: float32 uniforms (a grid of 2^-24) would round q up
            uniform = torch.rand(self.num_samples, generator=self.generator, dtype=torch.float64)
        return torch.nonzero(uniform < self.sample_rate).flatten().tolist()


class EmptyBatchCollate:
    """Wraps a ``collate_fn`` so that no samples give zero-row tensors shaped like ``collate_fn([dataset[0]])``."""

    def __init__(self, collate_fn: Collate, dataset: Dataset[Any]) -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset
        self._empty: Any = None

    def __call__(self, samples: list[Any]) -> Any:
        if samples:
            return self.collate_fn(samples)
        if self._empty is None:
            self._empty = _map_columns(self.collate_fn([self.dataset[0]]), slice(0, 0))
        return self._empty


class DPDataLoader(DataLoader[Any]):
    """A ``DataLoader`` with Poisson sampling.

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
        batch_listeners: functions called with the number of examples of each batch handed out.
        draws: a :class:`~dpnotebook.privacy._batches.DrawMarker` that marks each batch's tensors.
    """

    batch_sampler_class: type[PoissonBatchSampler] = PoissonBatchSampler
    #: the loader ``from_data_loader(distributed=True)`` builds (set by ``_distributed``)
    distributed_class: type[DPDataLoader]

    def __init__(
        self,
        dataset: Dataset[Any],
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
        """The batches, marked; each one's number of examples goes to ``batch_listeners`` when handed out."""
        drawn = cast(PoissonBatchSampler, self.batch_sampler).drawn
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

    @staticmethod
    def generator_of(loader: DataLoader[Any], generator: torch.Generator | None = None) -> torch.Generator | None:
        """The generator the Poisson version of ``loader`` draws with: ``generator``, else ``loader``'s own
        (a :class:`DPDataLoader`'s sampler's); ``None``: torch's global one."""
        sampler = loader.batch_sampler
        own = sampler.generator if isinstance(sampler, PoissonBatchSampler) else loader.generator
        return generator if generator is not None else own

    @classmethod
    def from_data_loader(
        cls,
        loader: DataLoader[Any],
        *,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        distributed: bool = False,
    ) -> DPDataLoader:
        """The Poisson version of ``loader``: same dataset, collate and workers, ``q = 1 / len(loader)``.

        Without ``generator`` the batches are drawn with :meth:`generator_of` ``loader``. With ``distributed=True``
        it is a :class:`~dpnotebook.privacy.DistributedDPDataLoader`.

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
        if not secure_mode:
            generator = cls.generator_of(loader, generator)
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

    Every tensor (and list) is cut along dim 0; a sample's ``K`` rows stay together; an empty batch
    yields nothing. Call ``optimizer.virtual_step()`` after each piece's backward, ``step()`` after the last.

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


def replaced_sampling(loader: DataLoader[Any]) -> list[str]:
    """The options of ``loader`` that Poisson sampling replaces."""
    replaced = []
    if isinstance(loader.sampler, RandomSampler):
        replaced.append("shuffle=True")
    elif not isinstance(loader.sampler, SequentialSampler):
        replaced.append(f"sampler={type(loader.sampler).__name__}")
    if loader.drop_last:
        replaced.append("drop_last=True")
    if loader.batch_sampler is not None and (
        loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler
    ):
        replaced.append(f"batch_sampler={type(loader.batch_sampler).__name__}")
    return replaced


def warn_replaced_sampling(loader: DataLoader[Any]) -> None:
    """Say which of ``loader``'s sampling options Poisson sampling ignores."""
    replaced = replaced_sampling(loader)
    if replaced:
        warnings.warn(
            f"data_loader has {' and '.join(replaced)}: ignored. Poisson sampling replaces the loader's own "
            f"sampling, as the privacy analysis requires: every sample joins each batch independently with "
            f"probability q = 1/len(data_loader) = {1 / len(loader):.4g}, so batches vary in size and no "
            f"sample is dropped. To silence this, build the DataLoader without {', '.join(replaced)}.",
            UserWarning,
            stacklevel=3,  # the user's make_private call
        )


class AugmultCollate:
    """A ``collate_fn`` for augmentation multiplicity: ``B*K`` rows, sample-major, ``K`` augmentations of each ``x``.

    The other fields (labels) are repeated ``K`` times; a model wrapped with the same ``K`` clips per sample.

    >>> import torch
    >>> collate = AugmultCollate(lambda x: x + 0.5, K=2)
    >>> x, y = collate([(torch.tensor([0.0]), 7), (torch.tensor([1.0]), 8)])
    >>> x.flatten().tolist(), y.tolist()
    ([0.5, 0.5, 1.5, 1.5], [7, 7, 8, 8])
    """

    def __init__(self, augment: Callable[[Any], Any], *, K: int, collate_fn: Collate = default_collate) -> None:
        self.augment = augment
        self.K = check_positive_int("K", K)
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        rows = [(self.augment(s[0]), *s[1:]) for s in samples for _ in range(self.K)]
        return self.collate_fn(rows)


def augmult_data_loader(
    dataset: Dataset[Any],
    *,
    augment: Callable[[Any], Any],
    K: int,
    sample_rate: float,
    generator: torch.Generator | None = None,
    secure_mode: bool = False,
    **kwargs: Any,
) -> DPDataLoader:
    """A Poisson :class:`DPDataLoader` whose batches hold ``K`` augmented rows per sampled sample.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> data = TensorDataset(torch.randn(50, 3), torch.arange(50))
    >>> loader = augmult_data_loader(data, augment=lambda x: x, K=4, sample_rate=0.2,
    ...                              generator=torch.Generator().manual_seed(0))
    >>> x, y = next(iter(loader))
    >>> x.shape[0] == 4 * len(y.unique()), bool((y.view(-1, 4) == y[::4, None]).all())
    (True, True)
    """
    collate = AugmultCollate(augment, K=K, collate_fn=kwargs.pop("collate_fn", default_collate))
    return DPDataLoader(
        dataset, sample_rate=sample_rate, collate_fn=collate, generator=generator, secure_mode=secure_mode, **kwargs
    )


def loader_k(data_loader: DataLoader[Any]) -> int | None:
    """The ``K`` of ``data_loader``'s :class:`AugmultCollate` (``None`` if it has none)."""
    collate = data_loader.collate_fn
    if isinstance(collate, EmptyBatchCollate):
        collate = collate.collate_fn
    return collate.K if isinstance(collate, AugmultCollate) else None


class BatchMemoryManager:
    """Context manager yielding physical batches of at most ``max_physical_batch_size`` samples.

    The optimizer's step on each piece but a logical batch's last is a virtual step; the last adds the noise.

    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> import dpnotebook
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

    Args:
        data_loader: yields logical batches (e.g. a :class:`DPDataLoader`).
        max_physical_batch_size: the most samples per physical batch.
        optimizer: the :class:`~dpnotebook.privacy.DPOptimizer` to tell which steps are virtual.
        K: rows per sample (default: the data loader's augmentation multiplicity).
    """

    def __init__(
        self,
        *,
        data_loader: DataLoader[Any],
        max_physical_batch_size: int,
        optimizer: DPOptimizer,
        K: int | None = None,
    ) -> None:
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be a DPOptimizer, got {type(optimizer).__name__}.")
        self.data_loader = data_loader
        self.max_physical_batch_size = check_positive_int("max_physical_batch_size", max_physical_batch_size)
        self.optimizer = optimizer
        self.K = (loader_k(data_loader) or 1) if K is None else check_positive_int("K", K)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.data_loader:
            pieces = list(split_batch(batch, max_physical_batch_size=self.max_physical_batch_size, K=self.K))
            pieces = pieces or [batch]  # an empty batch is still one (noise-only) step
            for i, piece in enumerate(pieces):
                self.optimizer.signal_skip_step(i < len(pieces) - 1)
                yield piece

    def __len__(self) -> int:
        """The expected number of physical batches."""
        expected = getattr(self.data_loader, "expected_batch_size", None) or self.data_loader.batch_size or 1
        return math.ceil(len(self.data_loader) * expected / self.max_physical_batch_size)

    def __enter__(self) -> BatchMemoryManager:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.optimizer.signal_skip_step(False)
