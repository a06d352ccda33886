"""Grad sampler for ``nn.Embedding``: a bias-free Linear layer whose input is the index's one-hot vector.

Row ``v`` of a sample's weight gradient is the sum of the backprops at the positions that looked
up ``v``, over its ``K`` copies, divided by ``K`` (:func:`embedding_weight_grads`); ``padding_idx``
positions add nothing. The fast form scatter-adds each backprop into row ``sample*V + idx`` of one
``[B*V, D]`` tensor, with no one-hot.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers._contracts import Grads, group_rows


def embedding_weight_grads(
    indices: Tensor, backprops: Tensor, num_embeddings: int, K: int, padding_idx: int | None = None
) -> Tensor:
    """The formula: ``[B, V, D]``, sample ``b``'s ``(1/K) sum_{copies, t} onehot(idx_t) g_t^T``.

    ``indices`` ``[B*K, *positions]``, ``backprops`` ``[B*K, *positions, D]``; ``padding_idx``
    counts as a zero one-hot vector (PyTorch never updates the padding row).

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

    >>> scatter_rows(torch.tensor([1, 1]), torch.ones(2, 1), torch.tensor([0, 0]), B=1, V=2, K=1)
    tensor([[[0.],
             [2.]]])
    """
    D = values.shape[-1]
    flat = values.new_zeros(B * V, D).index_add_(0, sample_of * V + indices, values)
    return flat.view(B, V, D).div_(K) if K > 1 else flat.view(B, V, D)


def embedding_grad_sampler(layer: nn.Embedding, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
    """Per-sample gradient of ``layer.weight``, by the formula."""
    weight = cast(nn.Parameter, layer.weight)  # torch's stubs type it as a Tensor; it is the layer's Parameter
    if not weight.requires_grad:
        return {}
    return {weight: embedding_weight_grads(activations[0], backprops, layer.num_embeddings, K, layer.padding_idx)}


def embedding_grad_sampler_fast(layer: nn.Embedding, activations: list[Tensor], backprops: Tensor, K: int) -> Grads:
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
