"""``opacus.accountants.utils`` under dpnotebook."""

from dpnotebook._opacus.accountants import get_noise_multiplier

__all__ = ["get_noise_multiplier"]
