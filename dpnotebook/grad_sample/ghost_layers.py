"""How ghost mode handles each layer type: norms and weighted sums from activations and backprops.

A *group* gathers every call of one layer in one forward pass (a layer may be
called more than once: its per-sample gradient is then the sum over the calls,
and norms do not add up over calls, so the calls are joined first). Each group
answers two questions:

* :meth:`GhostGroup.sq_norms`: every sample's squared gradient norm, per parameter;
* :meth:`GhostGroup.weighted_sums`: ``sum_b w_b * (sample b's gradient)`` per
  parameter, for the clip factors ``w`` (book-keeping: no second backward).

How each layer type is handled (:func:`ghost_handler`):

* ``nn.Linear``: Gram or direct norms (:mod:`~dpnotebook.grad_sample.ghost_norms`), one matmul for the sum;
* ``InProjection`` (of ``DPMultiheadAttention``): as Linear, for each block of rows a call used;
* ``nn.Embedding``: norms by matching indices, one ``index_add`` for the sum;
* ``GateProjection`` (of ``DPLSTM`` and co.): :mod:`~dpnotebook.grad_sample.ghost_rnn`;
* convolutions: :mod:`~dpnotebook.grad_sample.ghost_conv`;
* norm layers and the rest: materialised with the layer's registered grad sampler,
  then norms and ``tensordot``. Their per-sample gradients are small next to
  their activations (one entry per channel).

Groups that hold per-sample gradients (convolutions, norm layers) add up over
calls, so ghost mode makes them call by call, as each call's backprops arrive,
and lets go of that call's inputs and backprops (:attr:`GhostHandler.materialises`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._contract import group_rows
from dpnotebook.grad_sample.functorch_fallback import LayerCall
from dpnotebook.grad_sample.ghost_norms import (
    embedding_sq_norms,
    embedding_weighted_sum,
    linear_sq_norms,
    linear_strategy,
    linear_weighted_sum,
)
from dpnotebook.grad_sample.hooks import bound_arguments, sampler_grad_samples, to_batch_first
from dpnotebook.grad_sample.registry import find_grad_sampler

Grads = dict[nn.Parameter, Tensor]
#: ``scratch(key, shape, like)``: a buffer the caller keeps between steps (contents undefined).
Scratch = Callable[[tuple, tuple, Tensor], Tensor]


@dataclass
class GhostCall:
    """One recorded call: the layer's inputs, and (after backward) its output's gradient.

    Attributes:
        call: what the forward pass saw (as the hooks engine records it).
        backprops: gradient of the loss w.r.t. the output, batch-first, ``B*K`` rows.
        scale: undoes the loss reduction and averages over K (``rows/K`` for a mean, ``1/K`` for a sum).
        released: its per-sample gradients were formed and its inputs and backprops let go.
    """

    call: LayerCall
    backprops: Tensor | None = None
    scale: float = 1.0
    released: bool = False

    def release(self) -> None:
        """Let go of the inputs and backprops (after the call's per-sample gradients were formed)."""
        self.call.args, self.call.kwargs, self.backprops, self.released = (), {}, None, True
        self.call.extra["released"] = True

    def activations(self) -> list:
        return [to_batch_first(a, self.call.batch_dim) for a in bound_arguments(self.call.module, self.call.args, self.call.kwargs)]


class GhostGroup:
    """All calls of one layer in one forward pass (see the module docstring)."""

    how = "materialised"

    def sq_norms(self) -> Grads:
        raise NotImplementedError

    def weighted_sums(self, weights: Grads) -> Grads:
        raise NotImplementedError


class MaterialisedGroup(GhostGroup):
    """Per-sample gradients held in full (``{p: [B, *p.shape]}``), each multiplied by ``scale`` when used.

    The registered sampler's gradients (summed over calls), a convolution's, and
    the ``p.grad_sample`` of layers left to the hooks engine all take this form.
    """

    def __init__(self, grads: Grads, scale: float = 1.0) -> None:
        self.grads, self.scale = grads, scale

    def sq_norms(self) -> Grads:
        return {p: torch.linalg.vector_norm(g.flatten(1), dim=1).pow(2) * self.scale**2 for p, g in self.grads.items()}

    def weighted_sums(self, weights: Grads) -> Grads:
        return {
            p: torch.tensordot(weights[p].to(g.dtype) * self.scale, g, dims=1)
            for p, g in self.grads.items()
            if p in weights
        }

    def absorb(self, other: "MaterialisedGroup") -> None:
        """Add the per-sample gradients of ``other`` (another call of the layer, same samples) into these.

        >>> w = nn.Parameter(torch.zeros(2))
        >>> a, b = MaterialisedGroup({w: torch.ones(3, 2)}, 0.5), MaterialisedGroup({w: torch.ones(3, 2)}, 0.5)
        >>> a.absorb(b); a.grads[w][0].tolist()
        [2.0, 2.0]
        """
        if other.scale != self.scale:
            raise GradSampleError(f"calls of one forward pass were scaled differently ({self.scale} and {other.scale}).")
        for p, g in other.grads.items():
            self.grads[p] = self.grads[p].add_(g) if p in self.grads else g


def materialise(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> MaterialisedGroup:
    """The registered sampler's per-sample gradients of ``module``, summed over ``calls``."""
    entry = find_grad_sampler(module)
    total: Grads = {}
    for c in calls:
        for p, g in sampler_grad_samples(entry, c.call, c.backprops, K, c.scale * K).items():
            total[p] = total[p] + g if p in total else g
    return MaterialisedGroup(total)


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

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, blocks: dict[tuple[int, int], LinearPiece]) -> None:
        self.weight, self.bias, self.blocks = weight, bias, blocks
        self.how = "ghost " + "+".join(sorted({b.strategy for b in blocks.values()}))

    def sq_norms(self) -> Grads:
        out: Grads = {}
        if self.weight.requires_grad:
            out[self.weight] = sum(piece.weight_sq_norms() for piece in self.blocks.values())
        if self.bias is not None and self.bias.requires_grad:
            out[self.bias] = sum(piece.bias_grads().pow(2).sum(1) for piece in self.blocks.values())
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


def _disjoint(windows: list[tuple[int, int]]) -> bool:
    spans = sorted(windows)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def linear_group(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``nn.Linear`` (window = all rows) and ``InProjection`` (the rows each call used)."""
    blocks: dict[tuple[int, int], list] = {}
    for c in calls:
        acts = c.activations()
        rows = (0, module.weight.shape[0]) if len(acts) < 3 else tuple(acts[1])
        if len(acts) >= 3 and tuple(acts[2]) != rows:
            return materialise(module, calls, K)  # weight and bias rows differ: not a plain window
        blocks.setdefault(rows, []).append((acts[0], c.backprops, c.scale))
    if not _disjoint(list(blocks)):
        return materialise(module, calls, K)  # overlapping windows: their gradients would add up
    return LinearGroup(module.weight, getattr(module, "bias", None), {r: linear_piece(v, K) for r, v in blocks.items()})


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


def embedding_group(module: nn.Embedding, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``nn.Embedding``: the indices and backprops of all calls, side by side per sample."""
    if not module.weight.requires_grad:
        return MaterialisedGroup({})
    idx, G = [], []
    for c in calls:
        i, g = c.activations()[0], c.backprops
        g = g.reshape(*i.shape, module.embedding_dim)
        if module.padding_idx is not None:  # the padding row gets no gradient
            g = g * (i != module.padding_idx).unsqueeze(-1).to(g.dtype)
        idx.append(i.reshape(i.shape[0] // K, -1))
        G.append(g.reshape(i.shape[0] // K, -1, module.embedding_dim))
    return EmbeddingGroup(module.weight, torch.cat(idx, 1), torch.cat(G, 1), calls[0].scale)


GroupMaker = Callable[[nn.Module, list[GhostCall], int, Scratch], GhostGroup]


class GhostHandler(NamedTuple):
    """How ghost mode treats one kind of layer.

    Attributes:
        make_group: builds the layer's :class:`GhostGroup` from its calls in one forward pass.
        outside: names of parameters the layer's owner also uses outside its forward (an RNN's recurrence).
        materialises: its groups hold per-sample gradients (a :class:`MaterialisedGroup`), which add up
            over calls; so ghost mode makes one per call as soon as the call's backprops arrive and lets
            go of the call's inputs and backprops (memory then grows with B, not with the B*K rows).
    """

    make_group: GroupMaker
    outside: tuple[str, ...] = ()
    materialises: bool = False


def ghost_handler(module: nn.Module) -> GhostHandler | None:
    """The :class:`GhostHandler` of ``module``'s type, or ``None``.

    ``None``: ghost mode leaves the layer to the hooks engine (its registered
    sampler, or torch.func). A subclass that overrides ``forward`` is not matched.

    >>> from torch import nn
    >>> ghost_handler(nn.Conv2d(1, 2, 3)).materialises, ghost_handler(nn.Linear(2, 2)).materialises
    (True, False)
    >>> ghost_handler(nn.BatchNorm1d(3)) is None
    True
    """
    from dpnotebook.layers.attention_units import AppendBias, InProjection
    from dpnotebook.layers.gate_projection import GateProjection

    from dpnotebook.grad_sample.ghost_conv import conv_group
    from dpnotebook.grad_sample.ghost_rnn import gate_group

    table: dict[type, GhostHandler] = {
        nn.Linear: GhostHandler(linear_group),
        InProjection: GhostHandler(linear_group),
        nn.Embedding: GhostHandler(embedding_group),
        GateProjection: GhostHandler(gate_group, outside=("weight_hh", "bias_hh")),  # the recurrence uses them too
    }
    for t in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        table[t] = GhostHandler(conv_group, materialises=True)
    for t in (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, AppendBias):
        table[t] = GhostHandler(materialise, materialises=True)
    if isinstance(module, nn.Embedding) and module.max_norm is not None:
        return None  # max_norm renormalises the weight in place during the forward
    for cls in type(module).__mro__:
        if cls in table and (cls is type(module) or type(module).forward is cls.forward):
            return table[cls]
    return None


__all__ = [
    "GhostCall", "GhostGroup", "MaterialisedGroup", "LinearPiece", "linear_piece", "LinearGroup", "EmbeddingGroup",
    "GhostHandler", "ghost_handler", "materialise",
]
