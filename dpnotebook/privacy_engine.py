"""``opacus.privacy_engine`` under dpnotebook.

>>> PrivacyEngine.__module__
'dpnotebook.privacy.engine'
"""

from dpnotebook.privacy.engine import PrivacyEngine

__all__ = ["PrivacyEngine"]
