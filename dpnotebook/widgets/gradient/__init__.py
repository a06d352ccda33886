"""The gradient explorer: state, plots and widget."""

from dpnotebook.widgets.gradient.state import GradientState, compare_modes, max_difference
from dpnotebook.widgets.gradient.widget import GradientExplorer

__all__ = ["GradientExplorer", "GradientState", "compare_modes", "max_difference"]
