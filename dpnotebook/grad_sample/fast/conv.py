"""The fast seam for convolutions: per-sample weight gradients in chunks, into a reused buffer.

Three ways to form ``[B, *weight.shape]`` (each sample's weight gradient summed
over its K rows), all checked against each other and against the reference form
:func:`~dpnotebook.grad_sample.samplers.conv_ops.conv_weight_grad_per_sample`:

* ``"unfold"``: im2col (strided views, one copy) and one batched matrix product per chunk,
  ``[B, C_out, n] x [B, n, C_in*k*k]`` with ``n = K * positions``; often the
  fastest for small images or few input channels (``Conv2d`` with ``groups=1``);
* ``"grouped"``: one weight-gradient call of a convolution with ``B`` times the
  groups (:func:`~dpnotebook.grad_sample.samplers.conv_ops.conv_weight_grad_grouped`); often
  the fastest for many channels on small images;
* ``"vmap"``: the ordinary weight gradient of each sample's ``K`` rows, batched
  with ``vmap`` (:func:`~dpnotebook.grad_sample.samplers.conv_ops.conv_weight_grad_per_sample`);
  often as fast as the batch's own weight gradient for large images.

:func:`conv_method` picks one from the shapes alone, so the same code runs on every
machine and in every run (timing each once per layer shape is an opt-in,
:func:`set_conv_method`). All write chunk by chunk
into a buffer that the caller keeps from one step to the next, so that no
large tensor is allocated (and page-faulted) per step. Both the hooks-mode
sampler (:mod:`~dpnotebook.grad_sample.samplers.conv`) and ghost mode
(:mod:`~dpnotebook.grad_sample.samplers.materialised_norm`) call :func:`conv_per_sample_grads`.

>>> import torch
>>> from torch import nn
>>> conv = nn.Conv2d(2, 3, 3, padding=1)
>>> x, g = torch.randn(4, 2, 5, 5), torch.randn(4, 3, 5, 5)
>>> out = torch.empty(2, 3, 2, 3, 3)
>>> a = conv_per_sample_grads(conv, x, g, K=2, out=out, method="unfold").clone()
>>> b = conv_per_sample_grads(conv, x, g, K=2, out=out, method="vmap").clone()
>>> c = conv_per_sample_grads(conv, x, g, K=2, out=out, method="grouped")
>>> torch.allclose(a, b, atol=1e-5) and torch.allclose(a, c, atol=1e-5)
True
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.fast.device import ACCELERATOR_CONV_METHOD, scratch_bytes, tuned_here
from dpnotebook.grad_sample.samplers.conv_ops import (
    conv_weight_grad_grouped,
    conv_weight_grad_per_sample,
    unfold_patches,
)

#: Bytes of scratch (im2col patches, vmap inputs) per chunk of samples, divided by K so
#: that memory does not grow with K (a chunk holds at least one sample's K rows) ...
CHUNK_BYTES = 8 * 2**20
#: ... but never below this: chunks of one or two samples make many small calls, and at
#: K=16 they cost a quarter more time than chunks of 2 MB (SampleConvNet, B=32).
MIN_CHUNK_BYTES = 2 * 2**20


#: Timing rounds per method under the ``"timed"`` policy. The median, not the best: one lucky
#: round must not decide (SampleConvNet's second layer at B=128 timed 2.0 ms at best and 6.3 ms
#: typically with ``vmap``, 2.0 and 3.8 ms with ``unfold``).
ROUNDS = 5

#: Fastest method found for each layer configuration and input shape (the ``"timed"`` policy).
_CHOSEN: dict[tuple, str] = {}


def _methods(layer: nn.modules.conv._ConvNd) -> list[str]:
    both = ["grouped", "vmap"]
    return ["unfold", *both] if isinstance(layer, nn.Conv2d) and layer.groups == 1 else both


#: How :func:`conv_method` chooses: ``"shapes"`` (the default), ``"timed"``, or one method for every layer.
POLICIES = ("shapes", "timed", "unfold", "grouped", "vmap")
_policy = "shapes"

#: A ``Conv2d`` whose output has at most this many positions per channel goes by im2col.
UNFOLD_MAX_POSITIONS = 196
#: ... and so does one with at most this many input channels, whatever its output.
UNFOLD_MAX_IN_CHANNELS = 4


def set_conv_method(policy: str) -> None:
    """How the per-sample convolution gradients are formed from now on (all give the same numbers).

    Args:
        policy: ``"shapes"`` (the default: a fixed rule, :func:`conv_method`), ``"timed"``
            (time each method once per layer shape and keep the fastest: faster on some machines,
            but which code runs then depends on timing noise), or ``"unfold"``, ``"grouped"``,
            ``"vmap"`` for every layer (``"unfold"`` only where it applies).

    >>> set_conv_method("timed"); set_conv_method("shapes")
    >>> set_conv_method("fastest")
    Traceback (most recent call last):
    ...
    ValueError: set_conv_method(policy='fastest'): use one of ('shapes', 'timed', 'unfold', 'grouped', 'vmap').
    """
    global _policy
    if policy not in POLICIES:
        raise ValueError(f"set_conv_method(policy={policy!r}): use one of {POLICIES}.")
    _policy = policy
    _CHOSEN.clear()


def conv_method(layer: nn.modules.conv._ConvNd, x: Tensor, g: Tensor, K: int) -> str:
    """``"unfold"``, ``"grouped"`` or ``"vmap"``: how this layer's per-sample gradients are formed.

    On a tensor that is not on the CPU, :data:`~dpnotebook.grad_sample.fast.device.ACCELERATOR_CONV_METHOD`
    (the rule below was measured on a CPU; the GPU's is unmeasured, see :mod:`~dpnotebook.grad_sample.fast.device`).
    On the CPU, by default a rule on shapes, measured on a 2-core CPU over the benchmark models' layers:
    im2col (``"unfold"``) for a ``Conv2d`` without groups whose output has at most
    :data:`UNFOLD_MAX_POSITIONS` positions per channel or whose input has at most
    :data:`UNFOLD_MAX_IN_CHANNELS` channels (deep layers of small images, stems), the
    grouped weight-gradient call otherwise (many channels over large images, ``Conv1d``,
    ``Conv3d``, grouped convolutions). With :func:`set_conv_method` ``("timed")`` each method
    is timed instead (interleaved, median of five rounds, on up to 64 samples of the first
    batch) and the fastest kept for later batches of that shape.

    >>> import torch
    >>> from torch import nn
    >>> conv_method(nn.Conv1d(2, 3, 3), torch.randn(4, 2, 8), torch.randn(4, 3, 6), K=1)
    'grouped'
    >>> conv_method(nn.Conv2d(16, 32, 4, 2), torch.randn(4, 16, 13, 13), torch.randn(4, 32, 5, 5), K=1)
    'unfold'
    >>> conv_method(nn.Conv2d(16, 16, 3, padding=1), torch.randn(4, 16, 32, 32), torch.randn(4, 16, 32, 32), K=1)
    'grouped'
    """
    methods = _methods(layer)
    if _policy in methods:
        return _policy
    if _policy != "timed":
        if not tuned_here(x):  # the thresholds below were measured on a CPU (fast/device.py)
            return ACCELERATOR_CONV_METHOD
        positions = math.prod(g.shape[2:])
        few = positions <= UNFOLD_MAX_POSITIONS or layer.in_channels <= UNFOLD_MAX_IN_CHANNELS
        return "unfold" if "unfold" in methods and few else "grouped"
    key = (
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        layer.stride,
        layer.padding,
        layer.dilation,
        layer.padding_mode,
        tuple(x.shape[1:]),
        K,
        x.dtype,
        x.device,
    )
    if key not in _CHOSEN:
        rows = min(x.shape[0], 64 * K)
        xs, gs = x[:rows], g[:rows]
        out = x.new_empty(rows // K, *layer.weight.shape)
        timed: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(ROUNDS):  # interleaved: a burst of load elsewhere slows every method alike
            for m in methods:
                timed[m].append(_time(layer, xs, gs, K, out, m))
        _CHOSEN[key] = min(methods, key=lambda m: statistics.median(timed[m]))
    return _CHOSEN[key]


def _time(layer: nn.modules.conv._ConvNd, x: Tensor, g: Tensor, K: int, out: Tensor, method: str) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    conv_per_sample_grads(layer, x, g, K, out, method)
    sync()
    return time.perf_counter() - start


def _unfold_chunk(
    layer: nn.Conv2d, x: Tensor, g: Tensor, K: int, work: Tensor | None = None, out: Tensor | None = None
) -> Tensor:
    """``[b, C_out, C_in*kh*kw]``: per-sample gradients of ``b = rows/K`` samples by im2col (into ``out`` if given).

    The patches come from strided views (:func:`~dpnotebook.grad_sample.samplers.conv.unfold_patches`),
    copied once, a sample's K rows side by side: ``[b, C_in*kh*kw, K*positions]``
    (faster than ``F.unfold`` on CPU). The copy goes into ``work`` when given
    (``[>= b, C_in, kh, kw, K, oh, ow]``, a buffer kept from step to step), else into a new tensor.
    """
    patches = unfold_patches(x, layer)  # [r, C, oh, ow, kh, kw]
    rows, C, oh, ow, kh, kw = patches.shape
    b, n = rows // K, K * oh * ow
    windows = patches.reshape(b, K, C, oh, ow, kh, kw).permute(0, 2, 5, 6, 1, 3, 4)
    U = windows.reshape(b, C * kh * kw, n) if work is None else work[:b].copy_(windows).view(b, C * kh * kw, n)
    G = g.reshape(b, K, g.shape[1], oh * ow).transpose(1, 2).reshape(b, g.shape[1], n)
    return torch.bmm(G, U.transpose(1, 2), out=out)


def conv_per_sample_grads(
    layer: nn.modules.conv._ConvNd,
    x: Tensor,
    g: Tensor,
    K: int,
    out: Tensor,
    method: str | None = None,
    workspace: Callable[[tuple], Tensor] | None = None,
) -> Tensor:
    """Each sample's weight gradient (sum over its K rows, not yet scaled) written into ``out``.

    Args:
        layer: the convolution.
        x: its input ``[B*K, C_in, ...]``; g: the backprops ``[B*K, C_out, ...]``.
        K: rows per sample.
        out: ``[B, *weight.shape]`` buffer; returned filled.
        method: ``"unfold"`` (``Conv2d`` with ``groups=1`` only), ``"grouped"`` or ``"vmap"``;
            default :func:`conv_method`.
        workspace: ``workspace(shape)`` gives a buffer kept from step to step, for the
            im2col patches of one chunk; without it they go into a new tensor per chunk.
    """
    B = x.shape[0] // K
    if B == 0:
        return out
    method = method or conv_method(layer, x, g, K)
    weight = layer.weight.numel()  # shapes only: indexing a tensor would cost an operation each
    if method == "unfold":  # the im2col patches of a sample's K rows
        per_sample = K * math.prod(g.shape[2:]) * (weight // layer.out_channels) + weight
    else:
        per_sample = K * (math.prod(x.shape[1:]) + math.prod(g.shape[1:])) + weight
    budget = scratch_bytes(max(CHUNK_BYTES // K, MIN_CHUNK_BYTES), x)
    step = max(1, min(B, budget // max(1, per_sample * x.element_size())))
    flat = out.view(B, layer.out_channels, -1)
    work = None
    if method == "unfold" and workspace is not None:
        work = workspace((step, layer.in_channels, *layer.kernel_size, K, *g.shape[2:]))
    for s in range(0, B, step):
        xs, gs = x[s * K : (s + step) * K], g[s * K : (s + step) * K]
        if method == "unfold":
            # "unfold" is a method for a Conv2d only (see _methods)
            _unfold_chunk(cast(nn.Conv2d, layer), xs, gs, K, work, out=flat[s : s + step])
        elif method == "grouped":
            out[s : s + step] = conv_weight_grad_grouped(layer, xs, gs, K)
        else:
            out[s : s + step] = conv_weight_grad_per_sample(layer, xs, gs, K) * K
    return out


__all__ = ["conv_per_sample_grads", "conv_method", "set_conv_method", "POLICIES", "CHUNK_BYTES", "MIN_CHUNK_BYTES"]
