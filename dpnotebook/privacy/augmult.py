"""Augmentation multiplicity in the data loader: ``K`` augmented rows per sampled sample.

Poisson sampling picks *samples*; :class:`AugmultCollate` turns each picked
sample into ``K`` rows (sample-major), and a model wrapped with the same ``K``
averages each sample's ``K`` row gradients before clipping. So the sampling
rate, the expected batch size and the privacy accounting all count samples,
while the model sees ``B*K`` rows.

>>> import torch
>>> from torch.utils.data import TensorDataset
>>> loader = augmult_data_loader(TensorDataset(torch.zeros(10, 2)), augment=lambda x: x + 1, K=3,
...                              sample_rate=0.5, generator=torch.Generator().manual_seed(0))
>>> (x,) = next(iter(loader))
>>> x.shape[0] % 3, loader_k(loader)
(0, 3)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import default_collate

from dpnotebook.privacy.arguments import check_positive_int
from dpnotebook.privacy.data_loader import Collate, DPDataLoader, EmptyBatchCollate

__all__ = ["AugmultCollate", "augmult_data_loader", "loader_k"]


class AugmultCollate:
    """A ``collate_fn`` for augmentation multiplicity: ``K`` augmented copies of each sample.

    From ``B`` samples ``(x, y, ...)`` it builds ``B*K`` rows, sample-major
    (rows ``i*K .. i*K+K-1`` are ``augment(x_i)`` drawn ``K`` times), with the
    other fields (labels) repeated ``K`` times. A model wrapped with the same
    ``K`` averages each sample's ``K`` gradients before clipping, so privacy is
    counted per sample, not per row.

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

    def __call__(self, samples: list) -> Any:
        rows = [(self.augment(s[0]), *s[1:]) for s in samples for _ in range(self.K)]
        return self.collate_fn(rows)


def augmult_data_loader(
    dataset: Dataset,
    *,
    augment: Callable[[Any], Any],
    K: int,
    sample_rate: float,
    generator: torch.Generator | None = None,
    secure_mode: bool = False,
    **kwargs: Any,
) -> DPDataLoader:
    """A Poisson :class:`DPDataLoader` whose batches hold ``K`` augmented rows per sampled sample.

    ``sample_rate`` and ``expected_batch_size`` count samples, not rows.

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


def loader_k(data_loader: DataLoader) -> int | None:
    """The ``K`` of ``data_loader``'s :class:`AugmultCollate` (``None`` if it has none).

    >>> from torch.utils.data import TensorDataset
    >>> import torch
    >>> loader_k(DataLoader(TensorDataset(torch.zeros(4)), collate_fn=AugmultCollate(abs, K=3)))
    3
    """
    collate = data_loader.collate_fn
    if isinstance(collate, EmptyBatchCollate):
        collate = collate.collate_fn
    return collate.K if isinstance(collate, AugmultCollate) else None
