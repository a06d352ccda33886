"""The training monitor: state, plots and widget."""

from dpnotebook.widgets.monitor.state import METRICS, MonitorState
from dpnotebook.widgets.monitor.widget import TrainingMonitor

__all__ = ["TrainingMonitor", "MonitorState", "METRICS"]
