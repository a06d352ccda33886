"""``opacus.data_loader`` under dpnotebook."""

from dpnotebook.privacy import DPDataLoader

__all__ = ["DPDataLoader"]
