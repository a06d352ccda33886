"""Ghost norms of a linear layer: every sample's gradient norm without its gradient.

A linear layer at the ``n`` positions of sample ``b`` (``K`` copies times ``T`` steps), with
inputs ``A`` ``[n, in]`` and output gradients ``G`` ``[n, out]``, has the weight gradient
``g_b = Gᵀ A``. Its squared norm is either the **Gram** form ``<A Aᵀ, G Gᵀ>`` (``n² (in + out)``
multiply-adds) or **direct**, ``Gᵀ A`` formed (``n·in·out``); the clipped sum ``Σ_b c_b g_b`` is
one matrix product over all rows. An embedding is a linear layer on one-hot inputs: its norms
come from matching indices.

>>> A, G = torch.randn(3, 5, 4), torch.randn(3, 5, 2)      # B=3 samples, n=5 positions
>>> direct = torch.einsum("bno,bni->boi", G, A).flatten(1).pow(2).sum(1)
>>> torch.allclose(linear_sq_norms(A, G, strategy="gram"), direct, rtol=1e-4)
True
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample._engine.capturable import host_reads_allowed
from dpnotebook.grad_sample.samplers._contracts import (
    GhostCall,
    GhostGroup,
    Grads,
    MaterialisedGroup,
    Scratch,
    group_rows,
    keep_rows,
    materialise,
    register_norm_sampler,
    scratch_bytes,
)
from dpnotebook.units import InProjection

#: Largest scratch buffer (bytes) a norm computation fills at once; bigger batches go in chunks.
CHUNK_BYTES = 32 * 2**20
#: A Gram norm below ``GRAM_TRUST * eps * (in + out)`` times its cancellation-free bound is recomputed
#: in float64 (:func:`guard_gram`); above it, rounding moves it by at most ``1 / GRAM_TRUST``.
GRAM_TRUST = 100.0
#: What one per-sample gradient entry costs beyond its multiply-adds (writing it, reading it back
#: twice), in multiply-adds: fitted on a CPU (docs/performance.md).
SETTLE_PASSES = 30

__all__ = [
    "linear_sq_norms",
    "linear_weighted_sum",
    "linear_strategy",
    "settle_pays",
    "guard_gram",
    "embedding_sq_norms",
    "embedding_sq_norms_fixed",
    "embedding_weighted_sum",
    "CHUNK_BYTES",
    "GRAM_TRUST",
    "SETTLE_PASSES",
]


def linear_sq_norms(A: Tensor, G: Tensor, *, strategy: str | None = None) -> Tensor:
    """``‖G_bᵀ A_b‖²`` for every sample ``b`` (``A`` ``[B, n, in]``, ``G`` ``[B, n, out]``): shape ``[B]``.

    ``strategy``: ``"outer"``, ``"gram"`` or ``"direct"``; default: the cheaper (:func:`linear_strategy`).
    """
    B, n, d_in = A.shape
    strategy = strategy or linear_strategy(n, d_in, G.shape[2])
    if strategy == "outer":  # n == 1: ‖δ aᵀ‖² = ‖δ‖² ‖a‖²
        return A.flatten(1).pow(2).sum(1) * G.flatten(1).pow(2).sum(1)
    if strategy == "gram":  # ‖g_b‖² = Σ_{t,t'} (a_t·a_t')(δ_t·δ_t')
        gram = _in_chunks(A, G, 2 * n * n, lambda a, g: (a @ a.mT * (g @ g.mT)).sum((1, 2)))
        return guard_gram(A, G, gram)
    # materialised: g_b = G_bᵀ A_b, formed chunk by chunk in one reused buffer
    d_out = G.shape[2]
    buf = A.new_empty(_chunk(B, d_in * d_out, A), d_out, d_in)

    def direct(a: Tensor, g: Tensor) -> Tensor:
        return torch.linalg.vector_norm(torch.bmm(g.mT, a, out=buf[: len(a)]).flatten(1), dim=1).pow(2)

    return _in_chunks(A, G, d_in * d_out, direct)


def linear_weighted_sum(A: Tensor, G: Tensor, weights: Tensor) -> Tensor:
    """``Σ_b weights[b] * G_bᵀ A_b`` in one matrix product: shape ``[out, in]``.

    >>> A, G, w = torch.randn(3, 2, 4), torch.randn(3, 2, 5), torch.rand(3)
    >>> torch.allclose(linear_weighted_sum(A, G, w), torch.einsum("b,bno,bni->oi", w, G, A), atol=1e-5)
    True
    """
    B, n, d_in = A.shape
    d_out = G.shape[-1]
    w = weights.to(A.dtype)
    if n > 1 and G.transpose(0, 1).is_contiguous():  # time-major backprops (an RNN's): flatten without a copy
        a, g, rows = A.transpose(0, 1).reshape(n * B, d_in), G.transpose(0, 1).reshape(n * B, d_out), w.repeat(n)
    else:  # one position per sample: the rows are the samples, no repeat (a copy)
        a, g, rows = A.reshape(B * n, d_in), G.reshape(B * n, d_out), w if n == 1 else w.repeat_interleave(n)
    if d_in < d_out:  # weight the smaller side
        return torch.mm(g.t(), a * rows[:, None])
    return torch.mm((g * rows[:, None]).t(), a)


def linear_strategy(n: int, d_in: int, d_out: int) -> str:
    """``"outer"`` (``n == 1``), ``"gram"`` or ``"direct"``: the cheaper way to the norms alone.

    >>> linear_strategy(1, 784, 512), linear_strategy(64, 128, 384), linear_strategy(1024, 128, 384)
    ('outer', 'gram', 'direct')
    """
    if n <= 1:
        return "outer"
    return "gram" if n * n * (d_in + d_out) < n * d_in * d_out else "direct"


def settle_pays(n: int, d_in: int, d_out: int) -> bool:
    """Whether forming the per-sample gradients is the cheaper *whole* path, norms and clipped sum.

    Both paths pay ``n * in * out`` (the weighted sum, or forming them), so settling wins when the
    Gram norms' ``n² (in + out)`` exceed the settled gradients' ``SETTLE_PASSES * in * out``
    read-backs, or when the direct norm is the cheaper norm.

    >>> settle_pays(64, 128, 256), settle_pays(16, 128, 128), settle_pays(1024, 128, 384)
    (True, False, True)
    >>> linear_strategy(64, 128, 256)           # the norms alone would have kept the Gram path
    'gram'
    """
    if n <= 1:
        return False
    return n * n * (d_in + d_out) > SETTLE_PASSES * d_in * d_out or linear_strategy(n, d_in, d_out) == "direct"


def guard_gram(A: Tensor, G: Tensor, sq: Tensor) -> Tensor:
    """Gram norms ``sq`` made safe from cancellation (``docs/guarantees.md``): suspect samples redone in float64.

    A sample whose Gram norm is below ``GRAM_TRUST * eps * (in + out)`` times ``(Σ_t ‖a_t‖ ‖δ_t‖)²``
    (or not finite) gets ``‖G_bᵀ A_b‖`` in float64 plus ``n * eps * Σ_t ‖a_t‖ ‖δ_t‖`` (the
    rounding the float32 weighted sum may add).

    >>> a = torch.full((1, 2, 64), 1000.0); a[0, 1, 0] += 0.01   # two nearly equal positions
    >>> g = torch.ones(1, 2, 64); g[0, 1] = -1.0                 # opposite backprops
    >>> bool(guard_gram(a, g, torch.tensor([-256.0])) >= 64 * 0.01**2)   # true norm²: 64 * 0.01²
    True
    """
    if sq.numel() == 0:
        return sq
    eps = torch.finfo(A.dtype).eps
    reach = (torch.linalg.vector_norm(A, dim=2) * torch.linalg.vector_norm(G, dim=2)).sum(1)  # >= ‖G_bᵀ A_b‖
    suspect = ~(sq >= reach.pow(2) * (GRAM_TRUST * eps * (A.shape[2] + G.shape[2])))
    if not host_reads_allowed():  # a step a CUDA graph captures: every sample redone, selected on the device
        return torch.where(suspect, _gram64_bound(A, G, reach, eps).to(sq.dtype), sq)
    if not bool(suspect.any()):
        return sq
    idx = suspect.nonzero().flatten()
    exact = torch.bmm(G[idx].double().mT, A[idx].double()).flatten(1).pow(2).sum(1).sqrt()
    sq = sq.clone()
    sq[idx] = (exact + A.shape[1] * eps * reach[idx].double()).pow(2).to(sq.dtype)
    return sq


def _gram64_bound(A: Tensor, G: Tensor, reach: Tensor, eps: float) -> Tensor:
    """Every sample's :func:`guard_gram` value without reading the device: its Gram norm in float64, raised by
    a bound of that sum's own rounding, plus the float32 allowance ``n * eps * reach`` that the guard adds.

    In float64 each dot product ``a_t·a_t'`` errs by at most ``in * eps64 * ‖a_t‖ ‖a_t'‖`` (and ``δ`` alike),
    and the sum of the ``n²`` products by ``n² * eps64`` of their magnitudes, which add up to ``reach²``: so
    ``(in + out + n² + 2) * eps64 * reach²`` bounds the sum's error (to first order), and the result is at
    least the exact norm's square plus the allowance. It is above the guard's own value by that bound at
    most: on the guard's worst case below (cancellation to ``1e-12`` of ``reach²``), by 5 %.

    >>> a = torch.full((1, 2, 64), 1000.0); a[0, 1, 0] += 0.01   # two nearly equal positions
    >>> g = torch.ones(1, 2, 64); g[0, 1] = -1.0                 # opposite backprops
    >>> reach = (a.norm(dim=2) * g.norm(dim=2)).sum(1)
    >>> eager = float(guard_gram(a, g, torch.tensor([-256.0])))   # the float64 norm, read and redone
    >>> eager <= float(_gram64_bound(a, g, reach, torch.finfo(a.dtype).eps)) < 1.06 * eager
    True
    """
    B, n, d_in = A.shape
    gram = A.new_empty(B, dtype=torch.float64)
    step = _chunk(B, 4 * n * n, A)  # float64 scratch: twice the entries of a float32 one
    for s in range(0, B, step):
        a, g = A[s : s + step].double(), G[s : s + step].double()
        gram[s : s + step] = (a @ a.mT * (g @ g.mT)).sum((1, 2))
    r = reach.double()
    rounding = (d_in + G.shape[2] + n * n + 2) * torch.finfo(torch.float64).eps * r.pow(2)
    return ((gram + rounding).clamp(min=0).sqrt() + n * eps * r).pow(2)


def _chunk(B: int, per_sample: int, like: Tensor) -> int:
    budget = scratch_bytes(CHUNK_BYTES, like)
    return max(1, min(B, budget // max(1, per_sample * like.element_size())))


def _in_chunks(A: Tensor, G: Tensor, per_sample: int, norms: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``norms(a, g)`` over chunks of samples, each chunk's scratch (``per_sample`` entries each) in the budget."""
    out = A.new_empty(A.shape[0])
    step = _chunk(A.shape[0], per_sample, A)
    for s in range(0, A.shape[0], step):
        out[s : s + step] = norms(A[s : s + step], G[s : s + step])
    return out


def embedding_sq_norms(idx: Tensor, G: Tensor, V: int) -> Tensor:
    """Squared norm of each sample's embedding gradient, by matching indices: shape ``[B]``.

    Sample ``b`` adds ``G[b, t]`` ``[B, n, D]`` to row ``idx[b, t]`` ``[B, n]`` of ``V``; positions
    with equal indices add up before squaring (one ``unique`` finds them).

    >>> embedding_sq_norms(torch.tensor([[1, 1, 2]]), torch.tensor([[[1.0], [2.0], [5.0]]]), V=3)  # (1+2)² + 5²
    tensor([34.])
    """
    B, n = idx.shape
    if B == 0 or n == 0:
        return G.new_zeros(B)
    if not host_reads_allowed():  # unique's size is the data's: it reads the device
        return embedding_sq_norms_fixed(idx, G, V)
    sample = torch.arange(B, device=idx.device).repeat_interleave(n)
    keys, inverse = torch.unique(sample * V + idx.reshape(-1), return_inverse=True)
    summed = G.new_zeros(keys.shape[0], G.shape[-1]).index_add_(0, inverse, G.reshape(B * n, -1))
    return G.new_zeros(B).index_add_(0, torch.div(keys, V, rounding_mode="floor"), summed.pow(2).sum(1))


def embedding_sq_norms_fixed(idx: Tensor, G: Tensor, V: int) -> Tensor:
    """:func:`embedding_sq_norms` with shapes that do not depend on the indices (a CUDA graph can replay it).

    The ``B * n`` keys are sorted instead of made unique; a run of equal keys is one (sample, row) pair,
    numbered by the running count of key changes, and its positions add up in that slot before squaring.
    Slots past the last run stay 0.

    >>> idx, G = torch.tensor([[1, 1, 2], [0, 2, 0]]), torch.randn(2, 3, 4)
    >>> torch.allclose(embedding_sq_norms_fixed(idx, G, V=3), embedding_sq_norms(idx, G, V=3))
    True
    """
    B, n = idx.shape
    sample = torch.arange(B, device=idx.device).repeat_interleave(n)
    keys, order = torch.sort(sample * V + idx.reshape(-1))
    run = torch.cat([keys.new_zeros(1), (keys[1:] != keys[:-1]).cumsum(0)])  # slot of each sorted position
    summed = G.new_zeros(B * n, G.shape[-1]).index_add_(0, run, G.reshape(B * n, -1)[order])
    owner = keys.new_zeros(B * n).scatter_(0, run, torch.div(keys, V, rounding_mode="floor"))
    return G.new_zeros(B).index_add_(0, owner, summed.pow(2).sum(1))


def embedding_weighted_sum(idx: Tensor, G: Tensor, weights: Tensor, V: int) -> Tensor:
    """``Σ_b weights[b] * (sample b's embedding gradient)``: shape ``[V, D]``.

    >>> embedding_weighted_sum(torch.tensor([[0, 1]]), torch.ones(1, 2, 1), torch.tensor([0.5]), V=2).flatten()
    tensor([0.5000, 0.5000])
    """
    B, n = idx.shape
    rows = weights.to(G.dtype).repeat_interleave(n)[:, None]
    return G.new_zeros(V, G.shape[-1]).index_add_(0, idx.reshape(-1), G.reshape(B * n, -1) * rows)


class LinearPiece:
    """``scale * G_bᵀ A_b`` for every sample (``A`` ``[B, n, in]``, ``G`` ``[B, n, out]``), formed only if cheaper.

    ``transposed``: the weight is stored ``[in, out]`` (its gradient ``A_bᵀ G_b``, same norms).
    """

    transposed = False

    def __init__(self, A: Tensor, G: Tensor, scale: float) -> None:
        self.A, self.G, self.scale = A, G, scale
        self.strategy = linear_strategy(A.shape[1], A.shape[2], G.shape[2])
        self._bias: Tensor | None = None
        self._bias_sq: Tensor | None = None
        self._summed: Tensor | None = None
        self._scaled: tuple[Tensor, Tensor] | None = None

    def weight_sq_norms(self) -> Tensor:
        if self.strategy == "outer":  # one position: ‖scale δ aᵀ‖² = ‖a‖² ‖scale δ‖², the bias's norm reused
            return self.A.flatten(1).pow(2).sum(1) * self.bias_sq_norms()
        return linear_sq_norms(self.A, self.G, strategy=self.strategy) * self.scale**2

    def bias_sq_norms(self) -> Tensor:  # ‖scale Σ_t δ_t‖² per sample
        if self._bias_sq is None:
            self._bias_sq = self.position_sum().pow(2).sum(1) * self.scale**2
        return self._bias_sq

    def weight_sum(self, w: Tensor) -> Tensor:
        A, G = (self.G, self.A) if self.transposed else (self.A, self.G)
        return linear_weighted_sum(A, G, self.scaled(w))

    def scaled(self, w: Tensor) -> Tensor:  # w * scale, one product while the weight and bias share w
        if self._scaled is None or self._scaled[0] is not w:
            self._scaled = (w, w * self.scale)
        return self._scaled[1]

    def drop(self, keep: Tensor) -> None:
        self.A, self.G = keep_rows(self.A, keep), keep_rows(self.G, keep)
        self._bias = self._bias_sq = self._summed = self._scaled = None

    def bias_grads(self) -> Tensor:
        if self._bias is None:
            self._bias = self.position_sum() * self.scale  # [B, out]: small, so materialised
        return self._bias

    def position_sum(self) -> Tensor:  # Σ_t δ_t per sample, kept; a view where samples have one position
        if self._summed is None:
            self._summed = self.G[:, 0] if self.G.shape[1] == 1 else self.G.sum(1)
        return self._summed


def linear_piece(calls: list[tuple[Tensor, Tensor, float]], K: int) -> LinearPiece:
    """One :class:`LinearPiece` for ``(activations, backprops, scale)`` calls of one pass (same rows and scale)."""
    if len(calls) == 1:
        return LinearPiece(group_rows(calls[0][0], K), group_rows(calls[0][1], K), calls[0][2])
    A = torch.cat([group_rows(a, K) for a, _, _ in calls], 1)  # positions side by side
    return LinearPiece(A, torch.cat([group_rows(g, K) for _, g, _ in calls], 1), calls[0][2])


class LinearGroup(GhostGroup):
    """A weight (and bias) used as ``x @ weight[rows].T + bias[rows]``, ``rows`` per block of calls (``None``: all)."""

    def __init__(
        self, weight: nn.Parameter, bias: nn.Parameter | None, blocks: dict[tuple[int, int] | None, LinearPiece]
    ) -> None:
        self.weight, self.bias, self.blocks = weight, bias, blocks
        self.how = "ghost " + "+".join(sorted({b.strategy for b in blocks.values()}))

    def sq_norms(self) -> Grads:
        out: Grads = {}
        # blocks is never empty; reduce, not sum(), which would spend a kernel adding 0 to the first
        if self.weight.requires_grad:
            out[self.weight] = functools.reduce(operator.add, (b.weight_sq_norms() for b in self.blocks.values()))
        if self.bias is not None and self.bias.requires_grad:
            out[self.bias] = functools.reduce(operator.add, (b.bias_sq_norms() for b in self.blocks.values()))
        return out

    def weighted_sums(self, weights: Grads) -> Grads:
        out: Grads = {}
        for p, is_weight in ((self.weight, True), (self.bias, False)):
            if p is None or p not in weights:
                continue
            parts = {
                rows: piece.weight_sum(weights[p])
                if is_weight
                else piece.scaled(weights[p]).to(p.dtype) @ piece.position_sum()
                for rows, piece in self.blocks.items()
            }
            if len(parts) == 1 and next(iter(parts)) in (None, (0, p.shape[0])):
                out[p] = next(iter(parts.values()))
                continue
            out[p] = torch.zeros_like(p)
            for rows, part in parts.items():
                assert rows is not None  # several blocks: each has its rows
                out[p][rows[0] : rows[1]] += part
        return out

    def drop(self, keep: Tensor) -> None:
        for piece in self.blocks.values():
            piece.drop(keep)


def linear_settles(module: nn.Module, call: GhostCall, K: int) -> bool:
    """:func:`settle_pays` for a call, its ``n = K * positions`` rows per sample: long sequences, or many copies.

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


@register_norm_sampler(nn.Linear, InProjection, settles=linear_settles)
def linear_group(
    module: nn.Linear | InProjection, calls: list[GhostCall], K: int, scratch: Scratch | None = None
) -> GhostGroup:
    """``nn.Linear`` (window = all rows) and ``InProjection`` of ``DPMultiheadAttention`` (the rows each call used).

    >>> from dpnotebook.grad_sample import GhostGradSampleModule
    >>> model = GhostGradSampleModule(nn.Linear(3, 2))
    >>> model(torch.randn(4, 3)).sum().backward()
    >>> model.strategies()
    {'model': 'ghost outer'}
    """
    # torch's stubs type Linear.weight and .bias as Tensors; they are the layer's Parameters
    weight, bias = cast(nn.Parameter, module.weight), cast("nn.Parameter | None", getattr(module, "bias", None))
    blocks: dict[tuple[int, int] | None, list[tuple[Tensor, Tensor, float]]] = {}
    for c in calls:
        acts = c.activations()
        rows = None if len(acts) < 3 else tuple(acts[1])
        if len(acts) >= 3 and tuple(acts[2]) != rows:
            return materialise(module, calls, K)  # weight and bias rows differ: not a plain window
        blocks.setdefault(rows, []).append((acts[0], c.received(), c.scale))
    spans = sorted(r for r in blocks if r is not None)
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
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
