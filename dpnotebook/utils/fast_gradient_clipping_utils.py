"""``opacus.utils.fast_gradient_clipping_utils`` under dpnotebook."""

from dpnotebook.privacy import DPLossFastGradientClipping, DPTensorFastGradientClipping

__all__ = ["DPLossFastGradientClipping", "DPTensorFastGradientClipping"]
