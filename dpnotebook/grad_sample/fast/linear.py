"""The linear weight gradient per sample as one batched product, into a reused buffer.

Same numbers as :func:`~dpnotebook.grad_sample.samplers.linear.linear_weight_grads` (the
reference form, an einsum): ``torch.bmm`` writes ``[B, out, in]`` straight into a
buffer kept from step to step (:mod:`~dpnotebook.grad_sample.fast.buffers`), so a
large layer's per-sample gradients are not allocated, and page-faulted, afresh
every step.

>>> import torch
>>> from torch import nn
>>> from dpnotebook.grad_sample.samplers.linear import linear_weight_grads
>>> layer, a, g = nn.Linear(3, 2), torch.randn(4, 5, 3), torch.randn(4, 5, 2)
>>> torch.allclose(linear_weight_grads_into_buffer(layer, a, g, K=2), linear_weight_grads(a, g, K=2), atol=1e-6)
True
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import group_rows
from dpnotebook.grad_sample.fast.buffers import result_buffer


def linear_weight_grads_into_buffer(layer: nn.Module, activations: Tensor, backprops: Tensor, K: int) -> Tensor:
    """``[B, out, in]``: each sample's weight gradient, averaged over its K rows (no autograd graph kept).

    Args:
        layer: the layer (its buffers are kept while it lives).
        activations: ``[B*K, ..., in]``; backprops: ``[B*K, ..., out]``.
        K: rows per sample.
    """
    a, g = group_rows(activations, K), group_rows(backprops, K)
    buf = result_buffer(layer, "weight", (a.shape[0], g.shape[2], a.shape[2]), g)
    grads = torch.bmm(g.transpose(1, 2), a, out=buf)
    return grads.div_(K) if K > 1 else grads


__all__ = ["linear_weight_grads_into_buffer"]
