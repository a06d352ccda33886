"""``fix(model)``: a copy of the model in which what :func:`~dpnotebook.validate` flags is repaired.

Each repair is a *fixer*, registered for a layer type, that returns the replacement layer:
``BatchNorm`` becomes ``GroupNorm`` (see :func:`group_count`), an ``InstanceNorm`` with running
stats or an ``Embedding(Bag)`` with ``scale_grad_by_freq`` the same layer without them, and
``RNN``/``LSTM``/``GRU``/``MultiheadAttention`` their :mod:`dpnotebook.layers` twin, with the weights
copied. The DP layers compute what the originals compute; GroupNorm is not BatchNorm, so a model
with BatchNorm needs training after ``fix``. The original model is never touched.

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8))
>>> fix(model)[1]
GroupNorm(4, 8, eps=1e-05, affine=True...)
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import Tensor, nn

from dpnotebook.errors import UnsupportedModuleError
from dpnotebook.layers import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from dpnotebook.validation import format_problems, validate

__all__ = ["fix", "register_fixer", "group_count", "FixRefused"]

logger = logging.getLogger(__name__)

#: ``fn(layer, **options) -> replacement``; ``options`` are the keyword arguments of :func:`fix`
#: that ``fn`` names (all of them if it takes ``**kwargs``).
Fixer = Callable[..., nn.Module]
_FIXERS: dict[type, Fixer] = {}


class FixRefused(Exception):
    """Raised by a fixer that cannot repair this particular layer; the message says why."""


def register_fixer(*layer_types: type[nn.Module]) -> Callable[[Fixer], Fixer]:
    """Register ``fn(layer) -> replacement`` for layers of these types (and their subclasses)."""

    def decorator(fn: Fixer) -> Fixer:
        _FIXERS.update(dict.fromkeys(layer_types, fn))
        return fn

    return decorator


def group_count(channels: int, max_groups: int = 32) -> int:
    """Number of GroupNorm groups for ``channels``: the largest divisor ``G`` with ``G <= 32`` and ``G <= C/2``.

    Up to 32 groups is the usual choice (Wu & He, 2018); ``G <= C/2`` keeps two channels or more in a
    group (``GroupNorm(C, C)`` would normalise each channel alone, losing their relative scale).

    >>> [group_count(c) for c in (1, 3, 4, 6, 16, 64, 96, 7)]
    [1, 1, 2, 3, 8, 32, 32, 1]
    """
    for g in range(min(max_groups, channels // 2), 0, -1):
        if channels % g == 0:
            return g
    return 1


def _factory(module: nn.Module) -> dict[str, Any]:
    tensor: Tensor | None = next(itertools.chain(module.parameters(), module.buffers()), None)
    return {} if tensor is None else {"device": tensor.device, "dtype": tensor.dtype}


def _copy_weights(old: nn.Module, new: nn.Module) -> nn.Module:
    """Load ``old``'s parameters into ``new`` (same names), with their ``requires_grad`` and train/eval mode."""
    params = dict(old.named_parameters())
    new.load_state_dict({n: p for n, p in old.state_dict().items() if n in params or n in dict(new.named_parameters())})
    for name, p in new.named_parameters():
        if name in params:
            p.requires_grad_(params[name].requires_grad)
    return new.train(old.training)


@register_fixer(nn.modules.batchnorm._BatchNorm)
def _batch_norm_to_group_norm(
    bn: nn.modules.batchnorm._BatchNorm,
    *,
    num_groups: int | Callable[[int], int] | None = None,
    replace_bn_with_in: bool = False,
) -> nn.Module:
    if isinstance(bn, nn.modules.lazy.LazyModuleMixin) and bn.has_uninitialized_params():
        raise FixRefused("a lazy BatchNorm does not know its channels yet; run one forward pass first.")
    C = bn.num_features
    if replace_bn_with_in:
        if num_groups is not None:
            raise ValueError(
                f"num_groups={num_groups!r} with replace_bn_with_in=True: they choose different "
                "replacements. Fix: pass one of them."
            )
        dims = {nn.BatchNorm1d: 1, nn.BatchNorm2d: 2, nn.BatchNorm3d: 3}.get(type(bn))
        if dims is None:
            raise FixRefused(f"replace_bn_with_in=True has no InstanceNorm for {type(bn).__name__}.")
        norm: nn.Module = getattr(nn, f"InstanceNorm{dims}d")(C, eps=bn.eps, affine=bn.affine, **_factory(bn))
    else:
        G = group_count(C) if num_groups is None else num_groups(C) if callable(num_groups) else num_groups
        if isinstance(G, bool) or not isinstance(G, int) or G < 1 or C % G:
            raise ValueError(
                f"num_groups={G!r} is invalid for {type(bn).__name__}({C}): GroupNorm needs a number of "
                f"groups that divides the {C} channels. Fix: pass a divisor of {C}, or num_groups=None."
            )
        norm = nn.GroupNorm(G, C, eps=bn.eps, affine=bn.affine, **_factory(bn))
    return _copy_weights(bn, norm) if bn.affine else norm.train(bn.training)


@register_fixer(nn.modules.instancenorm._InstanceNorm)
def _instance_norm_without_running_stats(norm: nn.modules.instancenorm._InstanceNorm) -> nn.Module:
    if isinstance(norm, nn.modules.lazy.LazyModuleMixin):
        raise FixRefused("construct it as nn.InstanceNorm*d(..., track_running_stats=False).")
    new = copy.deepcopy(norm)
    new.track_running_stats = False
    new.running_mean = new.running_var = new.num_batches_tracked = None
    return new


@register_fixer(nn.Embedding, nn.EmbeddingBag)
def _embedding_without_freq_scaling(emb: nn.Embedding | nn.EmbeddingBag) -> nn.Module:
    new = copy.deepcopy(emb)
    new.scale_grad_by_freq = False
    return new


_DP_LAYERS: dict[type, type[nn.Module]] = {
    nn.RNN: DPRNN,
    nn.LSTM: DPLSTM,
    nn.GRU: DPGRU,
    nn.MultiheadAttention: DPMultiheadAttention,
}


@register_fixer(*_DP_LAYERS)
def _to_dp_layer(layer: nn.Module) -> nn.Module:
    """The DP twin, built with the layer's own arguments and holding its weights."""
    if getattr(layer, "proj_size", 0):
        raise FixRefused(f"dpnotebook.fix has no replacement for an LSTM with proj_size={layer.proj_size}.")
    cls = next(_DP_LAYERS[c] for c in type(layer).__mro__ if c in _DP_LAYERS)
    args = {name: vars(layer)[name] for name in inspect.signature(cls).parameters if name in vars(layer)}
    if isinstance(layer, nn.MultiheadAttention):
        args.update(bias=layer.in_proj_bias is not None, add_bias_kv=layer.bias_k is not None)
    return _copy_weights(layer, cls(**args, **_factory(layer)))


def _call_fixer(fixer: Fixer, module: nn.Module, options: dict[str, Any]) -> nn.Module:
    params = inspect.signature(fixer).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        options = {k: v for k, v in options.items() if k in params}
    return fixer(module, **options)


def fix(model: nn.Module, *, mode: str = "hooks", root: str = "model", **options: Any) -> nn.Module:
    """A deep copy of ``model`` with every problem :func:`~dpnotebook.validate` finds repaired.

    Each replacement is logged (``logging.INFO``, logger ``dpnotebook.fixers``).

    Args:
        model: the model; it is not changed.
        mode: the grad-sample mode the copy is for (what counts as a problem depends on it).
        root: the name that paths in messages start with.
        **options: passed to the fixers that take them: ``num_groups`` (an int, or a function
            of the channel count) or ``replace_bn_with_in=True`` for BatchNorm.

    >>> from torch import nn
    >>> fix(nn.Sequential(nn.BatchNorm1d(8)), num_groups=8)[0]
    GroupNorm(8, 8, eps=1e-05, affine=True...)
    >>> fix(nn.Sequential(nn.BatchNorm2d(8)), replace_bn_with_in=True)[0]
    InstanceNorm2d(8, eps=1e-05, momentum=0.1, affine=True...)

    Returns:
        The repaired copy (``model`` itself may be replaced: ``fix(nn.LSTM(2, 3))`` is a ``DPLSTM``).

    Raises:
        UnsupportedModuleError: some problems cannot be repaired automatically; the message
            names each one's path, type and what to do, and nothing is returned.
    """
    fixed = copy.deepcopy(model)
    reasons: dict[str, str] = {}
    paths = dict.fromkeys(p.path for p in validate(fixed, mode=mode, root=root))
    for path in sorted(paths, key=lambda p: -p.count(".")):  # deepest first
        name = path[len(root) + 1 :]
        old = fixed.get_submodule(name)
        fixer = next((_FIXERS[c] for c in type(old).__mro__ if c in _FIXERS), None)
        if fixer is None:
            continue
        try:
            new = _call_fixer(fixer, old, options)
        except FixRefused as why:
            reasons[path] = str(why)
            continue
        logger.info("dpnotebook.fix: %s (%s) replaced by %r", path, type(old).__name__, new)
        parent, _, child = name.rpartition(".")
        if name:
            setattr(fixed.get_submodule(parent), child, new)
        else:
            fixed = new
    default = "No automatic repair is registered for it."
    refused = [replace(p, why=f"{p.why} {reasons.get(p.path, default)}") for p in validate(fixed, mode=mode, root=root)]
    if refused:
        raise UnsupportedModuleError(
            f"dpnotebook.fix cannot repair {len(refused)} submodule(s) automatically:\n"
            f"{format_problems(refused)}\nThe model was not changed.",
            refused,
        )
    return fixed
