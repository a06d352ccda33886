"""The gradient explorer: state, plots and widget."""

from dpnotebook.widgets.gradient.state import GradientState, grad_samples_by_mode, max_difference
from dpnotebook.widgets.gradient.widget import GradientExplorer

__all__ = ["GradientExplorer", "GradientState", "grad_samples_by_mode", "max_difference"]
