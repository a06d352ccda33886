"""``opacus.utils.per_sample_gradients_utils`` under dpnotebook."""

from dpnotebook._opacus.utils import check_per_sample_gradients_are_correct

__all__ = ["check_per_sample_gradients_are_correct"]
