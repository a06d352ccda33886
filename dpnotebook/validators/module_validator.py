"""``opacus.validators.module_validator`` under dpnotebook."""

from dpnotebook._opacus.validators import ModuleValidator

__all__ = ["ModuleValidator"]
