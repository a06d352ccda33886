"""``opacus.optimizers.optimizer`` under dpnotebook."""

from dpnotebook._opacus.optimizers import DPOptimizer, _check_processed_flag, _mark_as_processed

__all__ = ["DPOptimizer", "_check_processed_flag", "_mark_as_processed"]
