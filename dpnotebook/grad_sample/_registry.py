"""The registry of per-layer grad samplers.

A grad sampler turns what a layer saw in the forward pass (its *activations*) and what came
back in the backward pass (the gradient of the loss w.r.t. its output, the *backprops*) into
per-sample gradients of its parameters. Samplers are registered per layer type:

>>> import torch
>>> from torch import nn
>>> from dpnotebook.grad_sample import register_grad_sampler, find_grad_sampler
>>> class Scale(nn.Module):
...     def __init__(self, d):
...         super().__init__()
...         self.w = nn.Parameter(torch.ones(d))
...     def forward(self, x):
...         return x * self.w
>>> @register_grad_sampler(Scale)
... def scale_sampler(layer, activations, backprops, K):
...     x, = activations                      # [B*K, ..., d]
...     per_row = (x * backprops).reshape(-1, K, x.shape[-1] if x.dim() > 1 else 1)
...     return {layer.w: per_row.sum(1) / K}
>>> find_grad_sampler(Scale(3)).name
'scale_sampler'

A sampler states the formula; a faster route to the same numbers is attached at registration
(``register_grad_sampler(nn.Conv2d, fast=conv_grad_sampler_fast)``) and runs whenever no
autograd graph of the result is asked for (:meth:`SamplerEntry.form`).
``tests/grad_sample/samplers/test_fast_forms.py`` holds every fast form equal to its formula.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

__all__ = [
    "GradSampler",
    "SamplerEntry",
    "register_grad_sampler",
    "find_grad_sampler",
    "registered_layer_types",
    "unregister_grad_sampler",
    "GradSamplerView",
]

GradSampler = Callable[..., dict[nn.Parameter, Tensor]]


@dataclass(frozen=True)
class SamplerEntry:
    """One registered sampler.

    Attributes:
        fn: The sampler function.
        takes_k: ``True`` for ``fn(layer, activations, backprops, K)``; ``False`` for a per-row
            ``fn(layer, activations, backprops)``, whose results are averaged over each sample's ``K`` rows.
        batch_first_always: The layer's inputs and outputs always have the batch in dim 0, whatever
            the wrapper's ``batch_first`` says (``EmbeddingBag`` outputs ``[bags, D]``).
        fast: The same numbers by a faster route (``fn(layer, activations, backprops, K)``), or ``None``.
    """

    fn: GradSampler
    takes_k: bool
    batch_first_always: bool = False
    fast: GradSampler | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def form(self, activations: Sequence[object], backprops: Tensor) -> GradSampler:
        """The fast form, or the formula where the backprops or an activation require a gradient.

        A fast form may write in place and skip autograd (double backward, gradient penalties need the graph).
        """
        needs_graph = backprops.requires_grad or any(isinstance(a, Tensor) and a.requires_grad for a in activations)
        return self.fn if self.fast is None or needs_graph else self.fast


_SAMPLERS: dict[type[nn.Module], SamplerEntry] = {}


def _takes_k(fn: GradSampler) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or len(positional) >= 4:
        return True
    if len(positional) == 3:
        return False
    raise TypeError(
        f"grad sampler {getattr(fn, '__name__', fn)!r} takes {len(positional)} positional arguments; "
        "expected fn(layer, activations, backprops, K) or the per-row fn(layer, activations, backprops)."
    )


def check_layer_types(caller: str, layer_types: Iterable[object]) -> None:
    """Raise ``TypeError`` for an entry of ``layer_types`` that is not an ``nn.Module`` subclass."""
    for t in layer_types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(
                f"{caller} takes nn.Module subclasses, got {t!r} (a {type(t).__name__}); "
                f"pass the class itself, e.g. {caller}(nn.Linear)."
            )


def register_grad_sampler(
    *layer_types: type[nn.Module], batch_first_always: bool = False, fast: GradSampler | None = None
) -> Callable[[GradSampler], GradSampler]:
    """Register ``fn`` as the grad sampler of each type in ``layer_types``.

    The contract of ``fn(layer, activations, backprops, K) -> {param: grad_sample}``:

    - ``activations`` is a **list**, one entry per forward argument (``(x,) = activations``); each
      tensor holds the ``B*K`` rows in dim 0, sample-major: sample ``i``'s ``K`` copies are rows
      ``i*K ... i*K+K-1`` (a ``batch_first=False`` model's rows are moved to dim 0 first, unless
      ``batch_first_always``).
    - ``backprops`` is the gradient of the loss w.r.t. the layer's output, rows in dim 0, the loss
      reduction already accounted for: use it as given.
    - Return, for each parameter that requires a gradient, ``[B, *param.shape]`` whose entry ``i`` is
      the **average over sample i's K rows** of each row's gradient (summed over positions). A per-row
      ``fn(layer, activations, backprops)`` returns ``[B*K, *param.shape]`` instead, averaged for it.

    Check yours with :func:`dpnotebook.testing.check_grad_sampler`.

    Args:
        *layer_types: ``nn.Module`` subclasses; a subclass that keeps ``forward`` inherits the sampler.
        batch_first_always: The layer always sees the batch in dimension 0.
        fast: A faster ``fn(layer, activations, backprops, K)`` giving the same numbers (it may skip
            autograd): it runs instead of ``fn`` when no graph is needed.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        TypeError: a type is not an ``nn.Module`` subclass, or the function has the wrong number of arguments.

    >>> from torch import nn
    >>> from dpnotebook.grad_sample import register_grad_sampler
    >>> register_grad_sampler("Linear")
    Traceback (most recent call last):
    ...
    TypeError: register_grad_sampler takes nn.Module subclasses, got 'Linear' (a str); pass the class itself, ...
    """
    check_layer_types("register_grad_sampler", layer_types)
    if fast is not None and not _takes_k(fast):
        raise TypeError(
            f"register_grad_sampler(fast={getattr(fast, '__name__', fast)!r}): a fast form takes K; "
            "define it as fast(layer, activations, backprops, K), returning what the formula returns."
        )

    def decorator(fn: GradSampler) -> GradSampler:
        entry = SamplerEntry(fn, _takes_k(fn), batch_first_always, fast)
        for t in layer_types:
            _SAMPLERS[t] = entry
        return fn

    return decorator


def unregister_grad_sampler(layer_type: type[nn.Module]) -> None:
    """Remove the sampler registered for exactly ``layer_type`` (if any)."""
    _SAMPLERS.pop(layer_type, None)


#: ``{module of an optional library: our module that registers samplers for its layers}``.
OPTIONAL_SAMPLERS = {
    "transformers.pytorch_utils": "dpnotebook.grad_sample.samplers.hf_conv1d",
    "transformers.models.t5.modeling_t5": "dpnotebook.grad_sample.samplers.hf_rms_norm",
    "transformers.models.llama.modeling_llama": "dpnotebook.grad_sample.samplers.hf_rms_norm",
}

_UNLOADABLE: set[str] = set()


def load_optional_samplers() -> None:
    """Import our module of :data:`OPTIONAL_SAMPLERS` for each of theirs already imported (a model holds its layers).

    One that fails to import (their layer renamed or moved) is skipped for good: those layers are replayed
    with ``torch.func``, exactly but slower.
    """
    for theirs, ours in OPTIONAL_SAMPLERS.items():
        if theirs in sys.modules and ours not in sys.modules and ours not in _UNLOADABLE:
            try:
                importlib.import_module(ours)
            except ImportError:
                _UNLOADABLE.add(ours)


def find_grad_sampler(module: nn.Module) -> SamplerEntry | None:
    """The sampler for ``module``'s type, or ``None``.

    The exact type first, then its base classes, whose sampler is inherited only while
    ``forward`` is too: a subclass that computes something else must register its own.
    """
    load_optional_samplers()
    cls = type(module)
    if cls in _SAMPLERS:
        return _SAMPLERS[cls]
    return next((_SAMPLERS[b] for b in cls.__mro__[1:] if b in _SAMPLERS and cls.forward is b.forward), None)


class GradSamplerView(MutableMapping[type[nn.Module], GradSampler]):
    """The registry as the ``GradSampleModule.GRAD_SAMPLERS`` dict ``{layer type: sampler function}``.

    Setting an item registers the function (as :func:`register_grad_sampler`); deleting one unregisters it.

    >>> from torch import nn
    >>> from dpnotebook import GradSampleModule
    >>> nn.Linear in GradSampleModule.GRAD_SAMPLERS
    True
    """

    def __getitem__(self, layer_type: type[nn.Module]) -> GradSampler:
        return _SAMPLERS[layer_type].fn

    def __setitem__(self, layer_type: type[nn.Module], fn: GradSampler) -> None:
        register_grad_sampler(layer_type)(fn)

    def __delitem__(self, layer_type: type[nn.Module]) -> None:
        del _SAMPLERS[layer_type]

    def __iter__(self) -> Iterator[type[nn.Module]]:
        return iter(list(_SAMPLERS))

    def __len__(self) -> int:
        return len(_SAMPLERS)


def registered_layer_types() -> list[str]:
    """Names of the layer types with a registered sampler, sorted.

    >>> from dpnotebook.grad_sample import registered_layer_types
    >>> "Linear" in registered_layer_types()
    True
    """
    return sorted(t.__name__ for t in _SAMPLERS)
