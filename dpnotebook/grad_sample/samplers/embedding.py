"""Grad sampler for ``nn.Embedding``.

Row ``r`` looked up indices ``idx[r, t]``; its weight gradient is the backprop
``g[r, t]`` added to row ``idx[r, t]`` of a zero ``[V, D]`` matrix. All samples
at once: scatter-add into one ``[B*V, D]`` buffer at ``sample(r)*V + idx``,
where ``sample(r) = r // K`` folds the K copies of a sample together.
Positions that hold ``padding_idx`` add nothing, as in ``weight.grad``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.fast.buffers import result_buffer
from dpnotebook.grad_sample.engine.registry import register_grad_sampler


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
    if not layer.weight.requires_grad:
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
    buf = None if values.requires_grad else result_buffer(layer, "weight", (B, V, D), values)
    return {layer.weight: scatter_rows(flat_idx, values, sample_of, B, V, K, out=buf)}
