"""``opacus.validators.errors`` under dpnotebook."""

from dpnotebook._opacus.validators import (
    IllegalModuleConfigurationError,
    NotYetSupportedModuleError,
    ShouldReplaceModuleError,
    UnsupportableModuleError,
    UnsupportedError,
    UnsupportedModuleError,
)

__all__ = [
    "UnsupportedError",
    "UnsupportedModuleError",
    "UnsupportableModuleError",
    "NotYetSupportedModuleError",
    "ShouldReplaceModuleError",
    "IllegalModuleConfigurationError",
]
