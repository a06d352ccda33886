"""``opacus.utils.fast_gradient_clipping_utils`` under dpnotebook.

>>> DPLossFastGradientClipping.__module__
'dpnotebook.privacy._optimizer'
"""

from dpnotebook.privacy import DPLossFastGradientClipping, DPTensorFastGradientClipping

__all__ = ["DPLossFastGradientClipping", "DPTensorFastGradientClipping"]
