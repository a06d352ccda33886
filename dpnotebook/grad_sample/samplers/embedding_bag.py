"""Grad sampler for ``nn.EmbeddingBag`` (modes ``sum`` and ``mean``).

Each output row is one bag, and each bag is one row of the batch. A bag's
output is ``sum_j w_j E[idx_j]``, with ``w_j`` the ``per_sample_weights`` (sum
mode) or ``1/len(bag)`` (mean mode), positions holding ``padding_idx`` left
out. So the bag's weight gradient puts ``w_j * backprop[bag]`` on row
``idx_j``: one vectorised scatter-add for all bags, no loop over the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.samplers.embedding import scatter_rows
from dpnotebook.grad_sample.engine.registry import register_grad_sampler


def bag_of_each_index(
    indices: Tensor, offsets: Tensor | None, n_bags: int, include_last_offset: bool
) -> tuple[Tensor, Tensor]:
    """Flattened indices and the bag each belongs to.

    >>> import torch
    >>> bag_of_each_index(torch.tensor([4, 5, 6]), torch.tensor([0, 2]), 2, False)
    (tensor([4, 5, 6]), tensor([0, 0, 1]))
    """
    if indices.dim() == 2:  # one bag per row of a [bags, length] input
        length = indices.shape[1]
        bags = torch.arange(indices.shape[0], device=indices.device).repeat_interleave(length)
        return indices.reshape(-1), bags
    starts = offsets[:-1] if include_last_offset else offsets
    positions = torch.arange(indices.numel(), device=indices.device)
    bags = torch.bucketize(positions, starts, right=True) - 1
    return indices, bags


@register_grad_sampler(nn.EmbeddingBag, batch_first_always=True)
def embedding_bag_grad_sampler(
    layer: nn.EmbeddingBag, activations: list[Tensor | None], backprops: Tensor, K: int
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradient of ``layer.weight``; activations are ``[input, offsets, per_sample_weights]``."""
    if not layer.weight.requires_grad:
        return {}
    if layer.mode == "max":
        raise NotImplementedError(
            "EmbeddingBag(mode='max') has no dpnotebook grad sampler: its gradient depends on "
            "which entry won each max. Use mode='sum' or mode='mean'."
        )
    indices, offsets, psw = (list(activations) + [None, None])[:3]
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
        weight = keep if psw is None else keep * psw.reshape(-1).to(backprops.dtype)
    values = backprops[bags] * weight.unsqueeze(-1)
    sample_of = bags.div(K, rounding_mode="floor")
    return {layer.weight: scatter_rows(flat_idx, values, sample_of, n_bags // K, layer.num_embeddings, K)}
