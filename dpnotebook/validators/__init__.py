"""``opacus.validators`` under dpnotebook (:mod:`dpnotebook._opacus.validators`)."""

from dpnotebook._opacus.validators import ModuleValidator, register_module_fixer, register_module_validator

__all__ = ["ModuleValidator", "register_module_validator", "register_module_fixer"]
