"""What Poisson sampling replaces in a user's ``DataLoader``, said in a warning.

``make_private`` (through :meth:`DPDataLoader.from_data_loader
<dpnotebook.privacy.data_loader.DPDataLoader.from_data_loader>`) keeps a loader's dataset, collate function and workers, but not how it
samples: ``shuffle=True``, ``drop_last=True`` or a sampler of its own are ignored, because the privacy
analysis needs every sample to join each batch independently with probability ``q``. Opacus warns of
``drop_last``; dpnotebook names each option it ignores.
"""

from __future__ import annotations

import warnings

from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

__all__ = ["replaced_sampling", "warn_replaced_sampling"]


def replaced_sampling(loader: DataLoader) -> list[str]:
    """The options of ``loader`` that Poisson sampling replaces: ``shuffle=True``, ``drop_last=True``, a sampler.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> data = TensorDataset(torch.randn(10, 2))
    >>> replaced_sampling(DataLoader(data, batch_size=2, shuffle=True, drop_last=True))
    ['shuffle=True', 'drop_last=True']
    >>> replaced_sampling(DataLoader(data, batch_size=2))
    []
    """
    replaced = []
    if isinstance(loader.sampler, RandomSampler):
        replaced.append("shuffle=True")
    elif not isinstance(loader.sampler, SequentialSampler):
        replaced.append(f"sampler={type(loader.sampler).__name__}")
    if loader.drop_last:
        replaced.append("drop_last=True")
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        replaced.append(f"batch_sampler={type(loader.batch_sampler).__name__}")
    return replaced


def warn_replaced_sampling(loader: DataLoader) -> None:
    """Say which of ``loader``'s sampling options Poisson sampling ignores (Opacus warns of ``drop_last``)."""
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
