"""``opacus.validators`` under dpnotebook: ``ModuleValidator`` and its registration decorators.

>>> from torch import nn
>>> ModuleValidator.is_valid(nn.Linear(2, 2))
True
"""

from dpnotebook.validators.module_validator import ModuleValidator
from dpnotebook.validators.utils import register_module_fixer, register_module_validator

__all__ = ["ModuleValidator", "register_module_validator", "register_module_fixer"]
