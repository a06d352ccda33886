"""Hugging Face's RMS norms, ``T5LayerNorm`` (T5) and ``LlamaRMSNorm`` (Llama): ``y = weight * x_hat``.

They get what ``nn.RMSNorm`` has: ``x_hat`` exactly as their forward computes it (:func:`t5_x_hat`,
:func:`llama_x_hat`: the dtypes differ), then the affine formula for the grad sampler and
``materialise`` for ghost mode. A class is registered only while its ``forward`` is, statement for
statement, the one these were written from (:data:`KNOWN_FORWARDS`); another stays a ``torch.func``
unit, and :data:`UNRECOGNISED` says why. ``transformers`` is not a dependency: this module is
imported once either model's module is (see ``_registry.load_optional_samplers``).

>>> import torch
>>> from transformers.models.llama.modeling_llama import LlamaRMSNorm
>>> from dpnotebook.testing import check_grad_sampler
>>> check_grad_sampler(LlamaRMSNorm(4), torch.randn(6, 3, 4), K=2).ok
True
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, affine_grads, materialise, register_norm_sampler


def _eps(layer: nn.Module) -> float:
    return float(cast(float, layer.variance_epsilon))


def t5_x_hat(layer: nn.Module, x: Tensor) -> Tensor:
    """``T5LayerNorm``'s normalised input: the variance in float32, ``x`` kept in its dtype, cast to a half weight's."""
    x_hat = x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + _eps(layer))
    dtype = cast(Tensor, layer.weight).dtype
    return x_hat.to(dtype) if dtype in (torch.float16, torch.bfloat16) else x_hat


def llama_x_hat(layer: nn.Module, x: Tensor) -> Tensor:
    """``LlamaRMSNorm``'s normalised input: all in float32, then back to ``x``'s dtype."""
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + _eps(layer))).to(x.dtype)


#: ``{(module, class): (the forward the formula was written from, its x_hat)}`` (transformers 5.24).
KNOWN_FORWARDS: dict[tuple[str, str], tuple[str, Callable[[nn.Module, Tensor], Tensor]]] = {
    ("transformers.models.t5.modeling_t5", "T5LayerNorm"): (
        """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
""",
        t5_x_hat,
    ),
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"): (
        """
def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
""",
        llama_x_hat,
    ),
}

#: ``{"module.Class": why it was not registered}``: its layers stay ``torch.func`` units.
UNRECOGNISED: dict[str, str] = {}

_X_HAT: dict[type[nn.Module], Callable[[nn.Module, Tensor], Tensor]] = {}


def same_forward(cls: type[nn.Module], source: str) -> bool:
    """Whether ``cls.forward`` is ``source`` statement for statement (``ast`` trees: comments and layout aside).

    >>> class Half(nn.Module):
    ...     def forward(self, x):
    ...         return x / 2  # halves
    >>> same_forward(Half, "def forward(self, x):\\n    return x / 2"), same_forward(Half, "def forward(self, x):\\n    return x * 0.5")
    (True, False)
    """
    try:
        theirs = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):  # no source to read: not recognised
        return False
    return ast.dump(theirs) == ast.dump(ast.parse(textwrap.dedent(source)))


def hf_rms_norm_grad_sampler(layer: nn.Module, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradient of ``layer.weight`` (``[B, hidden]``): ``sum_t backprop_t * x_hat_t``, averaged over K."""
    x_hat = _X_HAT[type(layer)](layer, activations[0])  # ours: affine_grads may overwrite it
    return affine_grads(layer, x_hat, backprops, K, channels_dim1=False, overwrite_x_hat=True)


def register_known(module_name: str, class_name: str) -> type[nn.Module] | None:
    """Register both samplers for ``module_name.class_name`` if its ``forward`` is the known one: the class, or ``None``."""
    source, x_hat = KNOWN_FORWARDS[(module_name, class_name)]
    key = f"{module_name}.{class_name}"
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        UNRECOGNISED[key] = f"cannot be imported ({e})"
        return None
    if not same_forward(cls, source):
        UNRECOGNISED[key] = (
            "its forward is not the one hf_rms_norm's formula was written from (transformers 5.24): "
            "its layers are replayed with torch.func (exact, slower)"
        )
        return None
    _X_HAT[cls] = x_hat
    register_grad_sampler(cls)(hf_rms_norm_grad_sampler)
    register_norm_sampler(cls, materialises=True)(materialise)
    return cls


for _module_name, _class_name in KNOWN_FORWARDS:
    register_known(_module_name, _class_name)

__all__ = [
    "t5_x_hat",
    "llama_x_hat",
    "KNOWN_FORWARDS",
    "UNRECOGNISED",
    "same_forward",
    "hf_rms_norm_grad_sampler",
    "register_known",
]
