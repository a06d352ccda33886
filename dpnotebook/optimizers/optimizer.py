"""``opacus.optimizers.optimizer`` under dpnotebook.

>>> DPOptimizer.__module__
'dpnotebook.privacy.optimizer'
"""

from dpnotebook.privacy.optimizer import DPOptimizer

__all__ = ["DPOptimizer"]
