"""Opt-in: reuse each layer's per-sample gradient tensor from one step to the next.

A per-sample gradient is ``B`` times its parameter's size, and a fresh tensor that size can cost
more in page faults than the product that fills it (``docs/performance.md``).
:func:`reuse_result_buffers` re-registers the Linear and convolution samplers with fast forms
that write into the tensor they returned last step for the same layer, when nothing but this
cache refers to it any more, so results a user keeps are never overwritten. Telling that needs
PyTorch's private ``torch._C._storage_Use_Count``, which is why this is not the default path.

>>> import torch
>>> from torch import nn
>>> layer, like, shape = nn.Linear(2, 2), torch.zeros(1), (64, 64, 64)   # 1 MiB of float32
>>> a = result_buffer(layer, shape, like)
>>> b = result_buffer(layer, shape, like)               # a is still held: b is new
>>> a is b
False
>>> b_id = id(b)
>>> del b                                               # b released: it comes back
>>> id(result_buffer(layer, shape, like)) == b_id
True
"""

from __future__ import annotations

import sys
import weakref
from functools import partial

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.capturable import buffers_kept
from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers.conv import conv_grad_sampler, conv_grad_sampler_fast
from dpnotebook.grad_sample.samplers.linear import linear_grad_sampler, linear_grad_sampler_fast

#: Smaller results are simply allocated (the allocator recycles small blocks itself).
MIN_BYTES = 2**20
#: Whether this PyTorch tells how many tensors share a storage (without it, nothing is ever reused).
CAN_COUNT_STORAGE_USERS = callable(getattr(torch._C, "_storage_Use_Count", None)) and hasattr(sys, "getrefcount")

#: The documented cache: each layer's last result, kept while the layer lives.
_KEPT: weakref.WeakKeyDictionary[nn.Module, Tensor] = weakref.WeakKeyDictionary()


def _only_cached(t: Tensor) -> bool:
    """Whether nothing but the cache refers to ``t`` or shares its memory."""
    # References: the cache, the caller's variable, this function's argument, getrefcount's own.
    if not CAN_COUNT_STORAGE_USERS or sys.getrefcount(t) > 4:
        return False
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2  # t itself + the temporary
    except (RuntimeError, TypeError, AttributeError):  # a build whose private function changed: never reuse
        return False


def result_buffer(layer: nn.Module, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` (``like``'s dtype and device): last step's, when nobody holds it."""
    if like.element_size() * torch.Size(shape).numel() < MIN_BYTES or like.requires_grad or not buffers_kept():
        return like.new_empty(shape)  # small, differentiated, or in a step a CUDA graph captures (capturable)
    t = _KEPT.get(layer)
    if t is not None and t.shape == shape and t.dtype == like.dtype and t.device == like.device and _only_cached(t):
        return t
    t = _KEPT[layer] = like.new_empty(shape)
    return t


def reuse_result_buffers(enabled: bool = True) -> None:
    """Switch the reuse on (or, with ``enabled=False``, back off) for the Linear and convolution fast forms.

    On, they write into :func:`result_buffer`; off, each result is a fresh tensor. The numbers are the same.

    >>> from torch import nn
    >>> from dpnotebook.grad_sample import find_grad_sampler, reuse_result_buffers
    >>> reuse_result_buffers()
    >>> find_grad_sampler(nn.Linear(2, 2)).fast.keywords["out_for"].__name__
    'result_buffer'
    >>> reuse_result_buffers(False)
    >>> find_grad_sampler(nn.Linear(2, 2)).fast.__name__
    'linear_grad_sampler_fast'
    """
    linear_fast = partial(linear_grad_sampler_fast, out_for=result_buffer) if enabled else linear_grad_sampler_fast
    conv_fast = partial(conv_grad_sampler_fast, out_for=result_buffer) if enabled else conv_grad_sampler_fast
    register_grad_sampler(nn.Linear, fast=linear_fast)(linear_grad_sampler)
    register_grad_sampler(nn.Conv1d, nn.Conv2d, nn.Conv3d, fast=conv_fast)(conv_grad_sampler)


__all__ = ["reuse_result_buffers", "result_buffer", "MIN_BYTES", "CAN_COUNT_STORAGE_USERS"]
