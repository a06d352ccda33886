"""Grad sampler for ``nn.Embedding``.

Row ``r`` looked up indices ``idx[r, t]``; its weight gradient is the backprop
``g[r, t]`` added to row ``idx[r, t]`` of a zero ``[V, D]`` matrix. All samples
at once: scatter-add into one ``[B*V, D]`` buffer at ``sample(r)*V + idx``,
where ``sample(r) = r // K`` folds the K copies of a sample together.
Positions that hold ``padding_idx`` add nothing, as in ``weight.grad``.

The same sums, read another way: a lookup ``E[idx]`` is ``onehot(idx)^T E``, so an
embedding is a bias-free Linear layer whose input is the one-hot vector of the
index, and its weight gradient is the Linear formula with ``a_t = onehot(idx_t)``.
That is the reference form, :func:`embedding_weight_grads`; the registered
sampler scatters by index instead (no ``[rows, positions, V]`` one-hot) into a
buffer reused from step to step, and the tests check both against the float64
oracle.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._contracts import group_rows
from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.fast.buffers import result_buffer


def embedding_weight_grads(
    indices: Tensor, backprops: Tensor, num_embeddings: int, K: int, padding_idx: int | None = None
) -> Tensor:
    """The reference form: ``[B, V, D]``, sample ``b``'s ``(1/K) sum_{copies, t} onehot(idx_t) g_t^T``.

    Row ``v`` of a sample's gradient is the sum of the backprops ``g_t`` at the
    positions ``t`` that looked up index ``v``, over the sample's ``K`` copies,
    divided by ``K``. Positions holding ``padding_idx`` count as a zero one-hot
    vector: PyTorch never updates the padding row.

    Args:
        indices: ``[B*K, *positions]`` looked-up indices, rows sample-major.
        backprops: ``[B*K, *positions, D]`` gradients of the loss w.r.t. the layer's output.
        num_embeddings: ``V``, the number of rows of the weight.
        K: augmentation multiplicity.
        padding_idx: the layer's ``padding_idx`` (``None``: no padding row).

    Returns:
        ``[B, V, D]``: every sample's weight gradient, averaged over its copies.

    >>> import torch
    >>> idx, g = torch.tensor([[1, 1], [0, 1]]), torch.ones(2, 2, 1)  # one sample, K=2 copies, 2 positions
    >>> embedding_weight_grads(idx, g, num_embeddings=3, K=2).squeeze(-1)
    tensor([[0.5000, 1.5000, 0.0000]])
    """
    one_hot = F.one_hot(indices, num_embeddings).to(backprops.dtype)  # [B*K, *positions, V]
    if padding_idx is not None:
        one_hot[..., padding_idx] = 0
    a, g = group_rows(one_hot, K), group_rows(backprops, K)  # [B, n, V], [B, n, D]
    return torch.einsum("bnv,bnd->bvd", a, g) / K


def scatter_rows(
    indices: Tensor, values: Tensor, sample_of: Tensor, B: int, V: int, K: int, out: Tensor | None = None
) -> Tensor:
    """Sum ``values[j]`` into row ``indices[j]`` of sample ``sample_of[j]``: ``[B, V, D] / K``.

    >>> import torch
    >>> scatter_rows(torch.tensor([1, 1]), torch.ones(2, 1), torch.tensor([0, 0]), B=1, V=2, K=1)
    tensor([[[0.],
             [2.]]])
    """
    D = values.shape[-1]
    if out is None:
        flat = torch.zeros(B * V, D, dtype=values.dtype, device=values.device)
    else:  # a [B, V, D] buffer to fill (see dpnotebook.grad_sample.fast.buffers)
        flat = out.view(B * V, D).zero_()
    flat.index_add_(0, sample_of * V + indices, values)
    return flat.view(B, V, D).div_(K) if K > 1 else flat.view(B, V, D)


@register_grad_sampler(nn.Embedding)
def embedding_grad_sampler(
    layer: nn.Embedding, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradient of ``layer.weight``."""
    weight = cast(nn.Parameter, layer.weight)  # torch's stubs type it as a Tensor; it is the layer's Parameter
    if not weight.requires_grad:
        return {}
    idx = activations[0]
    n = idx.shape[0]
    D = layer.embedding_dim
    values = backprops.reshape(-1, D)
    flat_idx = idx.reshape(-1)
    per_row = flat_idx.numel() // n if n else 0
    sample_of = torch.arange(n, device=idx.device).div(K, rounding_mode="floor")
    sample_of = sample_of.repeat_interleave(per_row)
    if layer.padding_idx is not None:
        values = values * (flat_idx != layer.padding_idx).unsqueeze(-1).to(values.dtype)
    V, B = layer.num_embeddings, n // K
    # Must equal embedding_weight_grads(idx, backprops, V, K, layer.padding_idx): the same sums,
    # scattered by index into a buffer reused from step to step (none under double backward).
    buf = None if values.requires_grad else result_buffer(layer, "weight", (B, V, D), values)
    return {weight: scatter_rows(flat_idx, values, sample_of, B, V, K, out=buf)}


__all__ = ["embedding_grad_sampler", "embedding_weight_grads", "scatter_rows"]
