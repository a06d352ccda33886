"""Per-sample gradients: the hooks engine, its layer samplers and their registry."""

from dpnotebook.grad_sample import (  # noqa: F401  (importing fills the registry)
    conv,
    embedding,
    embedding_bag,
    group_norm,
    instance_norm,
    layer_norm,
    linear,
    lora,
    rms_norm,
)
from dpnotebook.grad_sample.gsm_no_op import GradSampleModuleNoOp
from dpnotebook.grad_sample.ghost_registry import register_norm_sampler, unregister_norm_sampler
from dpnotebook.grad_sample.module import GradSampleModule, plan_units
from dpnotebook.grad_sample.registry import (
    find_grad_sampler,
    register_grad_sampler,
    registered_layer_types,
    unregister_grad_sampler,
)

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
