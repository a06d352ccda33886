"""``opacus.validators.utils`` under dpnotebook."""

from dpnotebook._opacus.validators import register_module_fixer, register_module_validator

__all__ = ["register_module_validator", "register_module_fixer"]
