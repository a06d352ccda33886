"""Linear layers and embeddings in ghost mode: norms without per-sample gradients, sums in one pass.

* ``nn.Linear``: Gram or direct norms (:mod:`~dpnotebook.grad_sample.samplers.linear_map_norms`),
  one matrix product for the weighted sum;
* ``InProjection`` (of ``DPMultiheadAttention``): as Linear, for each block of rows
  of the shared weight that a call used;
* ``nn.Embedding``: norms by matching indices, one ``index_add`` for the sum.

Several calls of one layer in one forward pass are joined first (their
positions concatenated per sample): a sample's gradient is the sum over the
calls, and norms do not add up.

>>> import torch
>>> from torch import nn
>>> from dpnotebook.grad_sample.ghost.wrapper import GhostGradSampleModule
>>> model = GhostGradSampleModule(nn.Linear(3, 2))
>>> model(torch.randn(4, 3)).sum().backward()
>>> model.strategies()
{'model': 'ghost outer'}
"""

from __future__ import annotations

import itertools
from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.ghost.groups import (
    GhostCall,
    GhostGroup,
    Grads,
    MaterialisedGroup,
    Scratch,
    keep_rows,
    materialise,
)
from dpnotebook.grad_sample.ghost.registry import register_norm_sampler
from dpnotebook.grad_sample.samplers.linear_map_norms import (
    embedding_sq_norms,
    embedding_weighted_sum,
    linear_sq_norms,
    linear_strategy,
    linear_weighted_sum,
    settle_pays,
)
from dpnotebook.grad_sample.samplers.sample_rows import group_rows
from dpnotebook.layers.attention_units import InProjection


class LinearPiece:
    """``G_b^T A_b`` (scaled) for every sample, never formed unless it is the cheaper way to its norm.

    Args:
        A: activations ``[B, n, in]``; G: backprops ``[B, n, out]``; scale: multiplies every gradient.
    """

    def __init__(self, A: Tensor, G: Tensor, scale: float) -> None:
        self.A, self.G, self.scale = A, G, scale
        self.strategy = linear_strategy(A.shape[1], A.shape[2], G.shape[2])
        self._bias: Tensor | None = None

    def weight_sq_norms(self) -> Tensor:
        return linear_sq_norms(self.A, self.G, strategy=self.strategy) * self.scale**2

    def weight_sum(self, w: Tensor) -> Tensor:
        return linear_weighted_sum(self.A, self.G, w * self.scale)

    def drop(self, keep: Tensor) -> None:
        """Zero the inputs and backprops of the samples where ``keep`` is False."""
        self.A, self.G, self._bias = keep_rows(self.A, keep), keep_rows(self.G, keep), None

    def bias_grads(self) -> Tensor:
        if self._bias is None:
            self._bias = self.G.sum(1) * self.scale  # [B, out]: small, so materialised
        return self._bias


def linear_piece(calls: list[tuple[Tensor, Tensor, float]], K: int) -> LinearPiece:
    """One :class:`LinearPiece` for several calls: their positions are concatenated per sample.

    The calls of one forward pass all hold the same rows (the wrapper checks it), hence the same scale.
    """
    A = torch.cat([group_rows(a, K) for a, _, _ in calls], 1) if len(calls) > 1 else group_rows(calls[0][0], K)
    G = torch.cat([group_rows(g, K) for _, g, _ in calls], 1) if len(calls) > 1 else group_rows(calls[0][1], K)
    return LinearPiece(A, G, calls[0][2])


class LinearGroup(GhostGroup):
    """A weight (and bias) used as ``x @ weight[rows].T + bias[rows]``, ``rows`` per block of calls."""

    def __init__(
        self, weight: nn.Parameter, bias: nn.Parameter | None, blocks: dict[tuple[int, int], LinearPiece]
    ) -> None:
        self.weight, self.bias, self.blocks = weight, bias, blocks
        self.how = "ghost " + "+".join(sorted({b.strategy for b in blocks.values()}))

    def sq_norms(self) -> Grads:
        out: Grads = {}
        # blocks is never empty, so each sum is a tensor
        if self.weight.requires_grad:
            out[self.weight] = cast(Tensor, sum(piece.weight_sq_norms() for piece in self.blocks.values()))
        if self.bias is not None and self.bias.requires_grad:
            out[self.bias] = cast(Tensor, sum(piece.bias_grads().pow(2).sum(1) for piece in self.blocks.values()))
        return out

    def weighted_sums(self, weights: Grads) -> Grads:
        out: Grads = {}
        for p, is_weight in ((self.weight, True), (self.bias, False)):
            if p is None or p not in weights:
                continue
            parts = {
                rows: piece.weight_sum(weights[p]) if is_weight else weights[p].to(p.dtype) @ piece.bias_grads()
                for rows, piece in self.blocks.items()
            }
            if list(parts) == [(0, p.shape[0])]:
                out[p] = parts[(0, p.shape[0])]
                continue
            out[p] = torch.zeros_like(p)
            for (r0, r1), part in parts.items():
                out[p][r0:r1] += part
        return out

    def drop(self, keep: Tensor) -> None:
        for piece in self.blocks.values():
            piece.drop(keep)


def linear_settles(module: nn.Module, call: GhostCall, K: int) -> bool:
    """Whether forming a call's per-sample gradients is the cheaper way to its norms *and* clipped sum,
    so it is settled (:func:`~dpnotebook.grad_sample.samplers.linear_map_norms.settle_pays`).

    That is when a sample's ``n = K * positions`` rows make the Gram matrices
    dearer than the passes over its ``[out, in]`` gradient: long sequences, or many copies.

    >>> import torch
    >>> from dpnotebook.grad_sample._engine.calls import LayerCall
    >>> layer = nn.Linear(64, 64)
    >>> call = GhostCall(LayerCall(layer, "l", (torch.zeros(8, 10, 64),), {}, [0], 0, 8, 0), torch.zeros(8, 10, 64))
    >>> linear_settles(layer, call, K=1), linear_settles(layer, call, K=4)   # n = 10 or 40 positions
    (False, True)
    """
    x, g = call.activations()[0], call.backprops
    if x.dim() < 3 or g is None:
        return False
    n = K * int(torch.Size(x.shape[1:-1]).numel())
    return settle_pays(n, x.shape[-1], g.shape[-1])


def _disjoint(windows: list[tuple[int, int]]) -> bool:
    spans = sorted(windows)
    return all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@register_norm_sampler(nn.Linear, InProjection, settles=linear_settles)
def linear_group(
    module: nn.Linear | InProjection, calls: list[GhostCall], K: int, scratch: Scratch | None = None
) -> GhostGroup:
    """``nn.Linear`` (window = all rows) and ``InProjection`` (the rows each call used)."""
    # torch's stubs type Linear.weight and .bias as Tensors; they are the layer's Parameters
    weight, bias = cast(nn.Parameter, module.weight), cast("nn.Parameter | None", getattr(module, "bias", None))
    blocks: dict[tuple[int, int], list[tuple[Tensor, Tensor, float]]] = {}
    for c in calls:
        acts = c.activations()
        rows = (0, weight.shape[0]) if len(acts) < 3 else tuple(acts[1])
        if len(acts) >= 3 and tuple(acts[2]) != rows:
            return materialise(module, calls, K)  # weight and bias rows differ: not a plain window
        blocks.setdefault(rows, []).append((acts[0], c.received(), c.scale))
    if not _disjoint(list(blocks)):
        return materialise(module, calls, K)  # overlapping windows: their gradients would add up
    return LinearGroup(weight, bias, {r: linear_piece(v, K) for r, v in blocks.items()})


class EmbeddingGroup(GhostGroup):
    """Embedding lookups of all calls: norms by matching indices, the sum by one ``index_add``."""

    how = "ghost indices"

    def __init__(self, weight: nn.Parameter, idx: Tensor, G: Tensor, scale: float) -> None:
        self.weight, self.idx, self.G, self.scale = weight, idx, G, scale

    def sq_norms(self) -> Grads:
        return {self.weight: embedding_sq_norms(self.idx, self.G, self.weight.shape[0]) * self.scale**2}

    def weighted_sums(self, weights: Grads) -> Grads:
        if self.weight not in weights:
            return {}
        w = weights[self.weight] * self.scale
        return {self.weight: embedding_weighted_sum(self.idx, self.G, w, self.weight.shape[0])}

    def drop(self, keep: Tensor) -> None:
        self.G = keep_rows(self.G, keep)


@register_norm_sampler(nn.Embedding)
def embedding_group(module: nn.Embedding, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``nn.Embedding``: the indices and backprops of all calls, side by side per sample."""
    if not module.weight.requires_grad:
        return MaterialisedGroup({})
    idx, G = [], []
    for c in calls:
        i, g = c.activations()[0], c.received()
        g = g.reshape(*i.shape, module.embedding_dim)
        if module.padding_idx is not None:  # the padding row gets no gradient
            g = g * (i != module.padding_idx).unsqueeze(-1).to(g.dtype)
        idx.append(i.reshape(i.shape[0] // K, -1))
        G.append(g.reshape(i.shape[0] // K, -1, module.embedding_dim))
    weight = cast(nn.Parameter, module.weight)  # torch's stubs type it as a Tensor
    return EmbeddingGroup(weight, torch.cat(idx, 1), torch.cat(G, 1), calls[0].scale)


__all__ = [
    "LinearPiece",
    "linear_piece",
    "LinearGroup",
    "linear_group",
    "linear_settles",
    "EmbeddingGroup",
    "embedding_group",
]
