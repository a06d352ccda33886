"""The registry of grad-sample modes: how per-sample gradients are computed.

>>> from torch import nn
>>> import dpnotebook
>>> type(dpnotebook.wrap_model(nn.Linear(2, 2), "functorch")).__name__
'FunctorchGradSampleModule'
>>> dpnotebook.wrap_model(nn.Linear(2, 2), "jax")
Traceback (most recent call last):
...
ValueError: grad_sample_mode='jax' is unknown; choose one of ['ew', 'functorch', ...].
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpnotebook.grad_sample.module import GradSampleModule, plan_units
from dpnotebook.mode_registry import available_modes, factory, register_mode

__all__ = ["wrap_model", "register_mode", "available_modes", "FunctorchGradSampleModule"]


def wrap_model(module: nn.Module, grad_sample_mode: str = "hooks", **kwargs: Any) -> nn.Module:
    """Wrap ``module`` so that backward fills ``p.grad_sample``, in the chosen mode.

    Args:
        module: the model.
        grad_sample_mode: a key of the mode registry (:func:`available_modes`).
        **kwargs: passed to the wrapper (``K``, ``batch_first``, ``loss_reduction``, ``strict``,
            ``replay_chunk``).
    """
    return factory(grad_sample_mode)(module, **kwargs)


class FunctorchGradSampleModule(GradSampleModule):
    """Per-sample gradients of the whole model at once with ``torch.func``.

    One hook on the model's output; in the backward pass, ``vmap`` over the
    ``B`` samples of ``grad`` of ``sum_k <model(x[i, k]), backprop[i, k]>``.
    Memory grows with ``B``, not ``B*K``: with ``K > 1`` the samples are
    replayed in chunks of at most ``B`` rows (``replay_chunk``, see
    :class:`GradSampleModule`). Any model that does not mix samples
    works, recurrent ones and ``batch_first=False`` included, but the forward
    pass is replayed in the backward pass.
    """

    grad_sample_mode = "functorch"

    def _plan(self) -> list:
        return plan_units(self._module, whole_model=True)


@register_mode("hooks")
def _hooks(module: nn.Module, **kwargs: Any) -> nn.Module:
    return GradSampleModule(module, **kwargs)


@register_mode("functorch")
def _functorch(module: nn.Module, **kwargs: Any) -> nn.Module:
    return FunctorchGradSampleModule(module, **kwargs)


@register_mode("ew")
def _ew(module: nn.Module, **kwargs: Any) -> nn.Module:
    from dpnotebook.grad_sample.expanded_weights import GradSampleModuleExpandedWeights

    return GradSampleModuleExpandedWeights(module, **kwargs)


from dpnotebook.grad_sample import ghost_mode  # noqa: E402,F401  (registers "ghost"; its wrapper is imported on first use)
