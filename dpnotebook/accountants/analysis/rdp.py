"""``opacus.accountants.analysis.rdp`` under dpnotebook."""

from dpnotebook._opacus.accountants import compute_rdp, get_privacy_spent

__all__ = ["compute_rdp", "get_privacy_spent"]
