"""Per-sample gradients: the machinery every mode shares, the layer samplers, ghost mode.

* :mod:`~dpnotebook.grad_sample.engine`: the wrappers, hooks, the store, layer
  calls and the registry of grad samplers;
* :mod:`~dpnotebook.grad_sample.samplers`: one file per layer family (its formula,
  any faster form attached at registration), its ghost-mode norm sampler beside it;
* :mod:`~dpnotebook.grad_sample.ghost`: ghost mode (norms and clipped sums without
  per-sample gradients) and the open registry of norm samplers.

Modules of the old flat layout still import from their old paths for one
release (:mod:`~dpnotebook.grad_sample.moved`).
"""

from types import ModuleType

from dpnotebook.grad_sample import moved, samplers  # noqa: F401  (importing samplers fills the registry)
from dpnotebook.grad_sample.engine.gsm_no_op import GradSampleModuleNoOp
from dpnotebook.grad_sample.engine.module import GradSampleModule, plan_units
from dpnotebook.grad_sample.engine.registry import (
    find_grad_sampler,
    register_grad_sampler,
    registered_layer_types,
    unregister_grad_sampler,
)
from dpnotebook.grad_sample.ghost.registry import register_norm_sampler, unregister_norm_sampler

moved.install()

__all__ = [
    "GradSampleModule",
    "GradSampleModuleNoOp",
    "plan_units",
    "register_grad_sampler",
    "unregister_grad_sampler",
    "find_grad_sampler",
    "registered_layer_types",
    "register_norm_sampler",
    "unregister_norm_sampler",
]


def __getattr__(name: str) -> ModuleType:
    """The submodules of the old flat layout as attributes (``grad_sample.linear``); they warn."""
    if f"{__name__}.{name}" in moved.MOVED:
        module = moved.import_old(f"{__name__}.{name}")
        globals()[name] = module  # warned once; ``from dpnotebook.grad_sample import x`` looks twice
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
