"""Result buffers that samplers reuse from one step to the next, when nobody holds them any more.

A per-sample gradient is ``B`` times the size of its parameter: for a
784x512 layer and ``B=128``, 200 MB. Allocating that afresh every step costs
more than computing it (the operating system hands out, and zero-fills, new
pages). So the big samplers ask :func:`result_buffer` for their output: it
gives back last step's tensor for the same layer when nothing but this cache
refers to it any more (``p.grad_sample`` was cleared by ``zero_grad``, and no
variable, view or saved tensor shares its memory), and a new one otherwise.
Results a user keeps are therefore never overwritten.

>>> import torch
>>> from torch import nn
>>> layer, like, shape = nn.Linear(2, 2), torch.zeros(1), (64, 64, 64)   # 1 MiB of float32
>>> a = result_buffer(layer, "weight", shape, like)
>>> b = result_buffer(layer, "weight", shape, like)     # a is still held: b is new
>>> a is b
False
>>> del a
>>> b_id = id(b)
>>> del b                                               # b released: it comes back
>>> id(result_buffer(layer, "weight", shape, like)) == b_id
True
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

#: Smaller results are simply allocated (the allocator recycles small blocks itself).
MIN_BYTES = 2**20

_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[str, Tensor]] = weakref.WeakKeyDictionary()


#: Whether this PyTorch tells how many tensors share a storage (a private function; without
#: it, no buffer is ever reused and every result is simply allocated).
CAN_COUNT_STORAGE_USERS = callable(getattr(torch._C, "_storage_Use_Count", None)) and hasattr(sys, "getrefcount")


def _only_cached(t: Tensor) -> bool:
    """Whether nothing but the cache refers to ``t`` or shares its memory."""
    if not CAN_COUNT_STORAGE_USERS:
        return False
    # References: the cache, the caller's variable, this function's argument, getrefcount's own.
    if sys.getrefcount(t) > 4:
        return False
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2  # t itself + the temporary
    except (RuntimeError, TypeError, AttributeError):  # a build whose private function changed: never reuse
        return False


def result_buffer(layer: nn.Module, role: str, shape: Sequence[int], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` (``like``'s dtype and device) for one of ``layer``'s results.

    Args:
        layer: the layer whose sampler asks (buffers are kept while it lives).
        role: which result, e.g. ``"weight"``.
        shape: the result's shape.
        like: gives dtype and device.
    """
    shape = tuple(shape)
    nbytes = like.element_size() * int(torch.Size(shape).numel())
    if nbytes < MIN_BYTES or like.requires_grad:
        return like.new_empty(shape)
    kept = _KEPT.setdefault(layer, {})
    t = kept.get(role)
    if (
        t is not None
        and tuple(t.shape) == shape
        and t.dtype == like.dtype
        and t.device == like.device
        and _only_cached(t)
    ):
        return t
    t = kept[role] = like.new_empty(shape)
    return t


__all__ = ["result_buffer", "MIN_BYTES", "CAN_COUNT_STORAGE_USERS"]
