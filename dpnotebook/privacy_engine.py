"""``opacus.privacy_engine`` under dpnotebook.

>>> PrivacyEngine.__module__
'dpnotebook.privacy._engine'
"""

from dpnotebook.privacy import PrivacyEngine

__all__ = ["PrivacyEngine"]
