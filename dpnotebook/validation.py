"""Which layers per-sample gradients can be computed for, and how to fix the rest.

A check looks at one submodule and returns ``(why, fix)`` or ``None``; a new rule is one decorated
function, which may name the modes it applies to (``nn.LSTM`` has no hooks-mode sampler, but
ExpandedWeights handles it). :func:`dpnotebook.fixers.fix` repairs what it can.

>>> from torch import nn
>>> from dpnotebook.validation import validate
>>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
>>> [p.path for p in validate(model)]
['model.1']
>>> rnn = nn.Sequential(nn.LSTM(3, 4))
>>> [p.path for p in validate(rnn)], validate(rnn, mode="ew")
(['model.0'], [])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeGuard, overload

import torch
from torch import nn

from dpnotebook.errors import UnsupportedModuleError
from dpnotebook.modes import validates_as

__all__ = ["Problem", "validate", "register_check", "raise_if_problems"]


@dataclass(frozen=True)
class Problem:
    """One submodule that cannot be used as it is: where it sits (``"model.features.3"``), its class name,
    what goes wrong with per-sample gradients, and what to do instead."""

    path: str
    module_type: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} ({self.module_type}): {self.why} Fix: {self.fix}"


Check = Callable[[nn.Module], "tuple[str, str] | None"]
_CHECKS: list[tuple[Check, frozenset[str] | None]] = []


@overload
def register_check(fn: Check, *, modes: Iterable[str] | None = None) -> Check: ...
@overload
def register_check(fn: None = None, *, modes: Iterable[str] | None = None) -> Callable[[Check], Check]: ...
def register_check(fn: Check | None = None, *, modes: Iterable[str] | None = None) -> Check | Callable[[Check], Check]:
    """Add a check ``fn(module) -> (why, fix) | None`` run on every submodule in ``modes`` (default: all).

    Use it as ``@register_check`` or ``@register_check(modes=["hooks"])``.
    """

    def add(check: Check) -> Check:
        _CHECKS.append((check, None if modes is None else frozenset(modes)))
        return check

    return add(fn) if fn is not None else add


# -- problems in every mode -------------------------------------------------------
@register_check
def _batch_norm(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return (
            "batch normalisation mixes the samples of a batch (each output depends on the "
            "batch statistics), so a sample's gradient is not its own.",
            "replace it with GroupNorm: dpnotebook.fix(model) does it for you.",
        )
    return None


@register_check
def _instance_norm_running_stats(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        return (
            "track_running_stats=True averages statistics over the samples of every batch "
            "into buffers that the model keeps.",
            "construct it with track_running_stats=False (dpnotebook.fix(model) does it).",
        )
    return None


@register_check
def _embedding_freq_scaling(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.scale_grad_by_freq:
        return (
            "scale_grad_by_freq=True divides each gradient by how often a word occurs in the "
            "whole batch, which mixes the samples.",
            "construct it with scale_grad_by_freq=False (dpnotebook.fix(model) does it).",
        )
    return None


# -- recurrent layers and attention: it depends on the mode -------------------------
def _rnn_fix(module: nn.RNNBase) -> str:
    if getattr(module, "proj_size", 0):
        return (
            "DPLSTM has no proj_size: use grad_sample_mode='ew', or an LSTM without proj_size followed by an nn.Linear."
        )
    return (
        f"replace it with dpnotebook.layers.DP{type(module).__name__} (same arguments, parameter names and "
        "state_dict); dpnotebook.fix(model) swaps it in with the weights copied. "
        "grad_sample_mode='ew' handles it too."
    )


def _is_native_rnn(module: nn.Module) -> TypeGuard[nn.RNN | nn.LSTM | nn.GRU]:
    return isinstance(module, (nn.RNN, nn.LSTM, nn.GRU))


@register_check(modes=["hooks"])
def _rnn_hooks(module: nn.Module) -> tuple[str, str] | None:
    if _is_native_rnn(module):
        return (
            "hooks mode has no grad sampler for torch's fused recurrent kernel, and its torch.func "
            "fallback could batch it only for nn.LSTM in float32 on the CPU (elsewhere the kernel "
            "updates tensors in place), so hooks mode refuses it on every device alike.",
            _rnn_fix(module),
        )
    return None


@register_check(modes=["functorch"])
def _rnn_functorch(module: nn.Module) -> tuple[str, str] | None:
    if not _is_native_rnn(module):
        return None
    weight = module.weight_ih_l0
    if isinstance(module, nn.LSTM) and weight.dtype == torch.float32 and weight.device.type == "cpu":
        return None  # oneDNN's float32 LSTM kernel is the one that vmap can batch
    return (
        "torch.func's vmap cannot batch torch's fused recurrent kernel here (it updates tensors in "
        "place; only nn.LSTM's float32 CPU kernel can be batched).",
        _rnn_fix(module),
    )


_MHA_FIX = (
    "replace it with dpnotebook.layers.DPMultiheadAttention (same arguments, parameter names and "
    "state_dict); dpnotebook.fix(model) swaps it in with the weights copied."
)


@register_check(modes=["hooks"])
def _attention_hooks(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.MultiheadAttention):
        return (
            "hooks mode has no grad sampler for it; the torch.func fallback would replay it, which "
            "fails with attention dropout and cannot tell which masks hold the batch.",
            _MHA_FIX,
        )
    return None


@register_check(modes=["functorch"])
def _attention_functorch(module: nn.Module) -> tuple[str, str] | None:
    if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
        return (
            f"its attention dropout (p={module.dropout}) draws random numbers, which torch.func "
            "cannot replay sample by sample.",
            _MHA_FIX + " Or construct it with dropout=0.0.",
        )
    return None


@register_check(modes=["ew"])
def _dp_layers_ew(module: nn.Module) -> tuple[str, str] | None:
    if getattr(module, "_dpn_grad_samples_from_children", False):
        return (
            "its per-sample gradients come from hooks-mode units, which ExpandedWeights does not use.",
            "use grad_sample_mode='hooks', 'ghost' or 'functorch'"
            # a DP recurrent layer keeps its torch.nn parameter names; ExpandedWeights has rules for nn.LSTM & co
            + (" (or the torch.nn layer it replaces, in 'ew' mode)." if hasattr(module, "weight_ih_l0") else "."),
        )
    return None


# -- running the checks -------------------------------------------------------------
def validate(model: nn.Module, *, mode: str = "hooks", root: str = "model") -> list[Problem]:
    """Every problem in ``model`` for grad-sample mode ``mode``, in module order (empty when all is well).

    Args:
        model: the module to inspect; it is not changed.
        mode: a registered grad-sample mode; a mode that builds on another runs its checks (``"ghost"``
            those of ``"hooks"``).
        root: the name that paths start with.

    Raises:
        ValueError: ``mode`` is not a registered mode.

    >>> from torch import nn
    >>> validate(nn.MultiheadAttention(4, 2), mode="functorch")
    []
    >>> print(validate(nn.MultiheadAttention(4, 2, dropout=0.1), mode="functorch")[0].path)
    model
    >>> validate(nn.Linear(2, 2), mode="hook")
    Traceback (most recent call last):
    ...
    ValueError: mode='hook' is unknown; choose one of ['ew', 'functorch', 'ghost', 'hooks'].
    """
    mode = validates_as(mode)
    return [
        Problem(f"{root}.{name}" if name else root, type(sub).__name__, *found)
        for name, sub in model.named_modules()
        for check, modes in _CHECKS
        if modes is None or mode in modes
        if (found := check(sub)) is not None
    ]


def format_problems(problems: list[Problem]) -> str:
    """One ``  - path (Type): why Fix: fix`` line per problem."""
    return "\n".join(f"  - {p}" for p in problems)


def raise_if_problems(problems: list[Problem]) -> None:
    """Raise one :class:`UnsupportedModuleError` that lists every problem."""
    if problems:
        raise UnsupportedModuleError(
            f"{len(problems)} submodule(s) cannot be used with per-sample gradients:\n"
            f"{format_problems(problems)}\n"
            "Call dpnotebook.validate(model) to list them, dpnotebook.fix(model) to repair what can be "
            "repaired, or pass strict=False to wrap anyway (their per-sample gradients would then be wrong).",
            problems,
        )
