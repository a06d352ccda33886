"""The augmentation-multiplicity explorer: state, plots and widget."""

from dpnotebook.widgets.augmult.state import AugmultState, AugmultTable
from dpnotebook.widgets.augmult.widget import AugmultExplorer

__all__ = ["AugmultExplorer", "AugmultState", "AugmultTable"]
