"""The clipping explorer: state, plots and widget."""

from dpnotebook.widgets.clipping.state import ClippingState, ClippingStats, clipping_stats
from dpnotebook.widgets.clipping.widget import ClippingExplorer

__all__ = ["ClippingExplorer", "ClippingState", "ClippingStats", "clipping_stats"]
