"""``opacus.utils.fast_gradient_clipping_utils`` under dpnotebook.

>>> DPLossFastGradientClipping.__module__
'dpnotebook.privacy.ghost_loss'
"""

from dpnotebook.privacy.ghost_loss import DPLossFastGradientClipping, DPTensorFastGradientClipping

__all__ = ["DPLossFastGradientClipping", "DPTensorFastGradientClipping"]
