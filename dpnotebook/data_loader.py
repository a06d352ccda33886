"""``opacus.data_loader`` under dpnotebook: Poisson-sampling ``DPDataLoader``.

>>> import torch
>>> from torch.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=10)
>>> len(DPDataLoader.from_data_loader(loader, distributed=False))
4
"""

from dpnotebook.privacy import DPDataLoader

__all__ = ["DPDataLoader"]
