"""``opacus.privacy_engine`` under dpnotebook."""

from dpnotebook.privacy import PrivacyEngine

__all__ = ["PrivacyEngine"]
