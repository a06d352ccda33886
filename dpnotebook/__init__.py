"""dpnotebook: differentially private deep learning in PyTorch, taught in Jupyter."""

from dpnotebook.errors import GradSampleError, GradSamplerMismatch, UnsupportedModuleError
from dpnotebook.grad_sample import GradSampleModule, register_grad_sampler
from dpnotebook.modes import available_modes, wrap_model
from dpnotebook.validation import validate

__version__ = "0.1.0"

__all__ = [
    "GradSampleModule",
    "register_grad_sampler",
    "validate",
    "wrap_model",
    "available_modes",
    "GradSampleError",
    "GradSamplerMismatch",
    "UnsupportedModuleError",
]
