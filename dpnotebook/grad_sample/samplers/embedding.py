"""Grad sampler for ``nn.Embedding``.

A lookup ``E[idx]`` is ``onehot(idx)^T E``, so an embedding is a bias-free Linear
layer whose input is the one-hot vector of the index, and its weight gradient is
the Linear formula with ``a_t = onehot(idx_t)``: row ``v`` of a sample's gradient
is the sum of the backprops ``g_t`` at the positions that looked up ``v``, over its
``K`` copies, divided by ``K`` (:func:`embedding_weight_grads`, the registered formula).
Positions that hold ``padding_idx`` add nothing, as in ``weight.grad``.

The fast form attached at registration (:func:`embedding_grad_sampler_fast`) forms
no ``[rows, positions, V]`` one-hot: it scatter-adds each backprop into row
``sample(r)*V + idx`` of one ``[B*V, D]`` tensor, ``sample(r) = r // K``.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import group_rows


def embedding_weight_grads(
    indices: Tensor, backprops: Tensor, num_embeddings: int, K: int, padding_idx: int | None = None
) -> Tensor:
    """The formula: ``[B, V, D]``, sample ``b``'s ``(1/K) sum_{copies, t} onehot(idx_t) g_t^T``.

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


def scatter_rows(indices: Tensor, values: Tensor, sample_of: Tensor, B: int, V: int, K: int) -> Tensor:
    """Sum ``values[j]`` into row ``indices[j]`` of sample ``sample_of[j]``: ``[B, V, D] / K``.

    >>> import torch
    >>> scatter_rows(torch.tensor([1, 1]), torch.ones(2, 1), torch.tensor([0, 0]), B=1, V=2, K=1)
    tensor([[[0.],
             [2.]]])
    """
    D = values.shape[-1]
    flat = values.new_zeros(B * V, D).index_add_(0, sample_of * V + indices, values)
    return flat.view(B, V, D).div_(K) if K > 1 else flat.view(B, V, D)


def embedding_grad_sampler(
    layer: nn.Embedding, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradient of ``layer.weight``, by the formula."""
    weight = cast(nn.Parameter, layer.weight)  # torch's stubs type it as a Tensor; it is the layer's Parameter
    if not weight.requires_grad:
        return {}
    return {weight: embedding_weight_grads(activations[0], backprops, layer.num_embeddings, K, layer.padding_idx)}


def embedding_grad_sampler_fast(
    layer: nn.Embedding, activations: list[Tensor], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """:func:`embedding_grad_sampler`'s numbers, scattered by index (no one-hot)."""
    weight = cast(nn.Parameter, layer.weight)
    if not weight.requires_grad:
        return {}
    idx = activations[0]
    n, flat_idx = idx.shape[0], idx.reshape(-1)
    values = backprops.reshape(-1, layer.embedding_dim)
    per_row = flat_idx.numel() // n if n else 0
    sample_of = torch.arange(n, device=idx.device).div(K, rounding_mode="floor").repeat_interleave(per_row)
    if layer.padding_idx is not None:
        values = values * (flat_idx != layer.padding_idx).unsqueeze(-1).to(values.dtype)
    return {weight: scatter_rows(flat_idx, values, sample_of, n // K, layer.num_embeddings, K)}


register_grad_sampler(nn.Embedding, fast=embedding_grad_sampler_fast)(embedding_grad_sampler)

__all__ = ["embedding_grad_sampler", "embedding_grad_sampler_fast", "embedding_weight_grads", "scatter_rows"]
