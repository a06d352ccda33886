"""Grad sampler for ``nn.EmbeddingBag`` (modes ``sum`` and ``mean``).

Each bag is one row of the batch, its output ``sum_j w_j E[idx_j]`` (``w_j`` the
``per_sample_weights``, or ``1/len(bag)`` in mean mode; ``padding_idx`` left out). So the bag's
weight gradient puts ``w_j * backprop[bag]`` on row ``idx_j``: one scatter-add for all bags,
both the formula and the path that runs (no separate fast form).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._registry import register_grad_sampler
from dpnotebook.grad_sample.samplers.embedding import scatter_rows


def bag_of_each_index(
    indices: Tensor, offsets: Tensor | None, n_bags: int, include_last_offset: bool
) -> tuple[Tensor, Tensor]:
    """Flattened indices and the bag each belongs to.

    >>> bag_of_each_index(torch.tensor([4, 5, 6]), torch.tensor([0, 2]), 2, False)
    (tensor([4, 5, 6]), tensor([0, 0, 1]))
    """
    if indices.dim() == 2:  # one bag per row of a [bags, length] input
        length = indices.shape[1]
        bags = torch.arange(indices.shape[0], device=indices.device).repeat_interleave(length)
        return indices.reshape(-1), bags
    if offsets is None:  # nn.EmbeddingBag refuses this too
        raise ValueError("a 1-D EmbeddingBag input needs offsets")
    starts = offsets[:-1] if include_last_offset else offsets
    positions = torch.arange(indices.numel(), device=indices.device)
    bags = torch.bucketize(positions, starts, right=True) - 1
    return indices, bags


def embedding_bag_weight_grads(
    layer: nn.EmbeddingBag,
    indices: Tensor,
    offsets: Tensor | None,
    per_sample_weights: Tensor | None,
    backprops: Tensor,
    K: int,
) -> Tensor:
    """The formula: ``[B, V, D]``, sample ``b``'s weight gradient, averaged over its ``K`` bags.

    Position ``j`` of bag ``r`` adds ``w_j * g_r`` to row ``idx_j``: ``w_j`` is ``per_sample_weights[j]``
    (or 1) in sum mode, ``1/(non-padding positions of the bag)`` in mean mode, 0 for ``padding_idx``.
    ``indices``: ``[bags, length]``, or 1-D with ``offsets``; ``backprops``: ``[B*K, D]``.

    >>> bag = nn.EmbeddingBag(3, 1, mode="mean")
    >>> idx, offsets, g = torch.tensor([0, 1, 1, 2]), torch.tensor([0, 3]), torch.ones(2, 1)  # K=2 bags
    >>> embedding_bag_weight_grads(bag, idx, offsets, None, g, K=2).squeeze(-1)
    tensor([[0.1667, 0.3333, 0.5000]])
    """
    n_bags = backprops.shape[0]
    flat_idx, bags = bag_of_each_index(indices, offsets, n_bags, layer.include_last_offset)
    keep = torch.ones_like(flat_idx, dtype=backprops.dtype)
    if layer.padding_idx is not None:
        keep = keep * (flat_idx != layer.padding_idx).to(backprops.dtype)
    if layer.mode == "mean":
        counts = torch.zeros(n_bags, dtype=backprops.dtype, device=backprops.device)
        counts.index_add_(0, bags, keep)
        weight = keep / counts.clamp(min=1)[bags]
    else:
        weight = keep if per_sample_weights is None else keep * per_sample_weights.reshape(-1).to(backprops.dtype)
    values = backprops[bags] * weight.unsqueeze(-1)
    sample_of = bags.div(K, rounding_mode="floor")
    return scatter_rows(flat_idx, values, sample_of, n_bags // K, layer.num_embeddings, K)


@register_grad_sampler(nn.EmbeddingBag, batch_first_always=True)
def embedding_bag_grad_sampler(
    layer: nn.EmbeddingBag, activations: list[Tensor | None], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradient of ``layer.weight``; activations are ``[input, offsets, per_sample_weights]``."""
    weight = cast(nn.Parameter, layer.weight)  # torch's stubs type it as a Tensor; it is the layer's Parameter
    if not weight.requires_grad:
        return {}
    if layer.mode == "max":
        raise NotImplementedError(
            "EmbeddingBag(mode='max') has no dpnotebook grad sampler: its gradient depends on "
            "which entry won each max. Use mode='sum' or mode='mean'."
        )
    indices, offsets, psw = (list(activations) + [None, None])[:3]
    if indices is None:
        raise ValueError("EmbeddingBag's grad sampler got no input indices")
    return {weight: embedding_bag_weight_grads(layer, indices, offsets, psw, backprops, K)}


__all__ = ["embedding_bag_grad_sampler", "embedding_bag_weight_grads", "bag_of_each_index"]
