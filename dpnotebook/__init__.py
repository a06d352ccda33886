"""dpnotebook: differentially private deep learning in PyTorch, taught in Jupyter.

>>> import dpnotebook
>>> {"hooks", "functorch", "ew"} <= set(dpnotebook.available_modes())
True

The DP-SGD names (``PrivacyEngine``, ``DPOptimizer``, ``DPDataLoader``) are
loaded on first use, so ``import dpnotebook`` stays quick; the widgets live in
``dpnotebook.widgets`` (they need the ``widgets`` extra).
"""

from importlib import import_module
from typing import Any

from dpnotebook.device import default_device
from dpnotebook.errors import GradSampleError, GradSamplerMismatch, UnsupportedModuleError
from dpnotebook.fixers import fix
from dpnotebook.grad_sample import GradSampleModule, register_grad_sampler
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from dpnotebook.modes import available_modes, wrap_model
from dpnotebook.validation import validate

__version__ = "0.1.0"

_PRIVACY = (
    "PrivacyEngine",
    "DPOptimizer",
    "DPDataLoader",
    "BatchMemoryManager",
    "AugmultCollate",
    "get_noise_multiplier",
    "compute_epsilon",
    "create_accountant",
    "clip_and_sum",
)

__all__ = [
    "GradSampleModule",
    "register_grad_sampler",
    "wrap_model",
    "available_modes",
    "validate",
    "fix",
    "default_device",
    "DPRNN",
    "DPLSTM",
    "DPGRU",
    "DPMultiheadAttention",
    *_PRIVACY,
    "GradSampleError",
    "GradSamplerMismatch",
    "UnsupportedModuleError",
]


def __getattr__(name: str) -> Any:
    if name in _PRIVACY:
        return getattr(import_module("dpnotebook.privacy"), name)
    raise AttributeError(f"module 'dpnotebook' has no attribute {name!r}; see dpnotebook.__all__")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
