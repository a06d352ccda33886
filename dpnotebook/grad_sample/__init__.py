"""Per-sample gradients: the wrappers of every mode, the layer samplers, the registries.

The public names are here; the folders behind them are:

* ``_registry``: the registry of per-layer grad samplers (the contract the samplers fill);
* :mod:`~dpnotebook.grad_sample.samplers`: one small file per layer family (its formula and ``K``
  folding), its ghost-mode norm sampler beside it; ``fast``: what the samplers do for speed;
* ``_engine``: the machinery every mode shares (hooks, the store, layer calls and their replay)
  and one module per mode: ``hooks``, ``functorch``, ``ew``, ``no_op``;
* ``ghost``: ghost mode (norms and clipped sums without per-sample gradients) and the open
  registry of norm samplers.

The modes register their wrapper classes in :mod:`dpnotebook.modes`.
"""

from dpnotebook.grad_sample import samplers  # noqa: F401  (importing samplers fills the registry)
from dpnotebook.grad_sample._engine.ew import GradSampleModuleExpandedWeights
from dpnotebook.grad_sample._engine.functorch import FunctorchGradSampleModule
from dpnotebook.grad_sample._engine.hooks import GradSampleModule, plan_units
from dpnotebook.grad_sample._engine.no_op import GradSampleModuleNoOp
from dpnotebook.grad_sample._registry import (
    find_grad_sampler,
    register_grad_sampler,
    registered_layer_types,
    unregister_grad_sampler,
)
from dpnotebook.grad_sample.ghost._wrapper import GhostGradSampleModule
from dpnotebook.grad_sample.samplers._contracts import materialise, register_norm_sampler, unregister_norm_sampler
from dpnotebook.grad_sample.samplers.buffers import reuse_result_buffers

__all__ = [
    "GradSampleModule",
    "FunctorchGradSampleModule",
    "GradSampleModuleExpandedWeights",
    "GhostGradSampleModule",
    "GradSampleModuleNoOp",
    "plan_units",
    "register_grad_sampler",
    "unregister_grad_sampler",
    "find_grad_sampler",
    "registered_layer_types",
    "register_norm_sampler",
    "unregister_norm_sampler",
    "materialise",
    "reuse_result_buffers",
]
