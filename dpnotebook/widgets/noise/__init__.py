"""The noise explorer: state, plots and widget."""

from dpnotebook.widgets.noise.state import NoiseState, NoiseView, projection_basis
from dpnotebook.widgets.noise.widget import NoiseExplorer

__all__ = ["NoiseExplorer", "NoiseState", "NoiseView", "projection_basis"]
