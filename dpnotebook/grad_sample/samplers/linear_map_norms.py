"""Per-sample gradient norms without per-sample gradients, and weighted sums in one pass.

For a linear map applied at ``n`` positions of one sample (its ``K`` copies
times ``T`` time steps, folded together), with inputs ``A`` ``[n, in]`` and
backprops ``G`` ``[n, out]``, the sample's weight gradient is ``G^T A``.
Its squared norm can be had two ways:

* **direct**: form ``G^T A`` (``n*in*out`` multiply-adds, an ``[out, in]`` matrix);
* **Gram** ("ghost norm"): ``||G^T A||^2 = <A A^T, G G^T>``, two ``[n, n]``
  matrices (``n^2 * (in + out)``); cheaper when ``n`` is small next to ``in*out/(in+out)``.

:func:`linear_sq_norms` picks the cheaper one. Once every sample's clip factor
``c_b`` is known, the clipped sum needs no per-sample gradient either
("book-keeping"): ``sum_b c_b G_b^T A_b = (c-weighted G)^T A`` is one matrix
product over all rows (:func:`linear_weighted_sum`).

>>> import torch
>>> A, G = torch.randn(3, 5, 4), torch.randn(3, 5, 2)      # B=3 samples, n=5 positions
>>> direct = torch.einsum("bno,bni->boi", G, A).flatten(1).pow(2).sum(1)
>>> torch.allclose(linear_sq_norms(A, G, strategy="gram"), direct, rtol=1e-4)
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpnotebook.grad_sample.samplers._device import scratch_bytes

#: Largest scratch buffer (bytes) a direct norm computation fills at once; bigger batches go in chunks.
CHUNK_BYTES = 32 * 2**20
#: A Gram norm below ``GRAM_TRUST * eps * (in + out)`` times its cancellation-free bound
#: ``(sum_t ||a_t|| ||g_t||)^2`` is recomputed directly in float64 (:func:`guard_gram`). Above it,
#: rounding (at most ``eps * (in + out)`` of the bound) moves it by at most ``1 / GRAM_TRUST``.
GRAM_TRUST = 100.0
#: What one per-sample gradient entry costs beyond its multiply-adds, in multiply-adds: writing it, reading it
#: back for its norm and for the weighted sum (memory-bound passes). Fitted on a CPU, one thread, B = 32, with
#: the two real paths (see :func:`settle_pays`): ``[n, in, out]`` = ``[64, 128, 1000]`` (``n^2 (in + out)`` is
#: 36 times ``in * out``) and ``[64, 128, 512]`` (40) were faster settled, ``[64, 192, 768]`` (27),
#: ``[64, 384, 384]`` (21) and ``[64, 512, 512]`` (16) faster on the Gram path.
SETTLE_PASSES = 30

__all__ = [
    "linear_strategy",
    "settle_pays",
    "linear_sq_norms",
    "linear_weighted_sum",
    "shared_gram_sq_norms",
    "shared_gram_pays",
    "embedding_sq_norms",
    "embedding_weighted_sum",
    "repeat_rows",
    "guard_gram",
    "CHUNK_BYTES",
    "GRAM_TRUST",
    "SETTLE_PASSES",
]


def linear_strategy(n: int, d_in: int, d_out: int) -> str:
    """``"outer"`` (``n == 1``), ``"gram"`` or ``"direct"``: the cheaper way to get the norms.

    >>> linear_strategy(1, 784, 512), linear_strategy(64, 128, 384), linear_strategy(1024, 128, 384)
    ('outer', 'gram', 'direct')
    """
    if n <= 1:
        return "outer"
    return "gram" if n * n * (d_in + d_out) < n * d_in * d_out else "direct"


def settle_pays(n: int, d_in: int, d_out: int) -> bool:
    """Whether forming the per-sample gradients (and keeping them) is the cheaper *whole* path for a linear map.

    The clipped sum needs the norms and then the weighted sum. Two paths:

    * **Gram**: ``n^2 (in + out)`` for the norms, then the weighted sum, one matrix product over all
      rows: ``n * in * out`` per sample;
    * **settled**: form ``G_b^T A_b`` (``n * in * out``), then its norm and the weighted sum read it
      back: ``SETTLE_PASSES * in * out`` (memory-bound passes, see :data:`SETTLE_PASSES`).

    Both pay ``n * in * out``, so the settled path wins when ``n^2 (in + out) > SETTLE_PASSES * in * out``,
    and whenever the direct norm is the cheaper norm (:func:`linear_strategy`): that forms the
    per-sample gradients anyway. Comparing the norms alone leaves out that the Gram path still owes a
    product as large as the per-sample gradients, and kept the Gram path for sequence layers of a
    transformer (``n = 64``, ``128 -> 256``) where it costs 1.4x the settled path.

    >>> settle_pays(64, 128, 256), settle_pays(16, 128, 128), settle_pays(1024, 128, 384)
    (True, False, True)
    >>> linear_strategy(64, 128, 256)           # the norms alone would have kept the Gram path
    'gram'
    """
    if n <= 1:
        return False
    return n * n * (d_in + d_out) > SETTLE_PASSES * d_in * d_out or linear_strategy(n, d_in, d_out) == "direct"


def _chunk(B: int, per_sample: int, like: Tensor) -> int:
    budget = scratch_bytes(CHUNK_BYTES, like)  # measured on a CPU; larger on a GPU (samplers/_device.py)
    return max(1, min(B, budget // max(1, per_sample * like.element_size())))


def linear_sq_norms(A: Tensor, G: Tensor, *, strategy: str | None = None) -> Tensor:
    """``||G_b^T A_b||_F^2`` for every sample ``b``: shape ``[B]``.

    Args:
        A: activations ``[B, n, in]``.
        G: backprops ``[B, n, out]``.
        strategy: ``"outer"``, ``"gram"`` or ``"direct"``; default: :func:`linear_strategy`.
    """
    B, n, d_in = A.shape
    d_out = G.shape[-1]
    strategy = strategy or linear_strategy(n, d_in, d_out)
    if B == 0:
        return A.new_zeros(0)
    if strategy == "outer":  # n == 1: ||g a^T||^2 = ||g||^2 ||a||^2
        return A.flatten(1).pow(2).sum(1) * G.flatten(1).pow(2).sum(1)
    out = A.new_empty(B)
    if strategy == "gram":
        step = _chunk(B, 2 * n * n, A)
        for s in range(0, B, step):
            a, g = A[s : s + step], G[s : s + step]
            out[s : s + step] = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
        return guard_gram(A, G, out)
    step = _chunk(B, d_in * d_out, A)
    scratch = A.new_empty(step, d_out, d_in)
    for s in range(0, B, step):
        a, g = A[s : s + step], G[s : s + step]
        per_sample = torch.bmm(g.transpose(1, 2), a, out=scratch[: a.shape[0]])
        out[s : s + step] = torch.linalg.vector_norm(per_sample.flatten(1), dim=1).pow(2)
    return out


def shared_gram_sq_norms(As: list[Tensor], G: Tensor) -> list[Tensor]:
    """``||G_b^T A_b||^2`` for several ``A`` (``[B, n, in_i]``) that share the backprops ``G``: one ``G G^T``.

    An RNN layer's input and hidden weights receive the same gate backprops, so
    their Gram norms share the costly ``[n, n]`` matrix of ``G``.

    >>> A1, A2, G = torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(2, 3, 6)
    >>> n1, n2 = shared_gram_sq_norms([A1, A2], G)
    >>> torch.allclose(n2, linear_sq_norms(A2, G, strategy="direct"), rtol=1e-4)
    True
    """
    B, n = G.shape[:2]
    out = [G.new_empty(B) for _ in As]
    step = _chunk(B, (1 + len(As)) * n * n, G)
    for s in range(0, B, step):
        g = G[s : s + step]
        gg = torch.bmm(g, g.transpose(1, 2))
        for o, A in zip(out, As, strict=True):
            a = A[s : s + step]
            o[s : s + step] = (torch.bmm(a, a.transpose(1, 2)) * gg).sum((1, 2))
    return [guard_gram(A, G, o) for A, o in zip(As, out, strict=True)]


def guard_gram(A: Tensor, G: Tensor, sq: Tensor) -> Tensor:
    """Gram norms ``sq`` made safe from cancellation: suspect samples recomputed directly in float64.

    ``<A A^T, G G^T>`` adds ``n^2`` products of size up to ``||a_t|| ||a_s|| ||g_t|| ||g_s||``;
    when a sample's positions cancel (nearly equal inputs, opposite backprops) the
    float32 sum is rounding noise: too small, negative or NaN, and the sample would
    be clipped too little. A sample whose Gram norm is below ``GRAM_TRUST * eps * (in + out)``
    times ``(sum_t ||a_t|| ||g_t||)^2`` (or not finite) gets ``||G_b^T A_b||`` in float64, plus
    ``n * eps * sum_t ||a_t|| ||g_t||``: the rounding the float32 weighted sum may add to it.

    >>> a = torch.full((1, 2, 64), 1000.0); a[0, 1, 0] += 0.01   # two nearly equal positions
    >>> g = torch.ones(1, 2, 64); g[0, 1] = -1.0                 # opposite backprops
    >>> bool(guard_gram(a, g, torch.tensor([-256.0])) >= 64 * 0.01**2)   # true norm^2: 64 * 0.01^2
    True
    """
    if sq.numel() == 0:
        return sq
    eps = torch.finfo(A.dtype).eps
    reach = (torch.linalg.vector_norm(A, dim=2) * torch.linalg.vector_norm(G, dim=2)).sum(1)  # >= ||G_b^T A_b||
    suspect = ~(sq >= reach.pow(2) * (GRAM_TRUST * eps * (A.shape[2] + G.shape[2])))
    if not bool(suspect.any()):
        return sq
    idx = suspect.nonzero().flatten()
    a, g = A[idx].double(), G[idx].double()
    exact = torch.bmm(g.transpose(1, 2), a).flatten(1).pow(2).sum(1).sqrt()
    sq = sq.clone()
    sq[idx] = (exact + A.shape[1] * eps * reach[idx].double()).pow(2).to(sq.dtype)
    return sq


def shared_gram_pays(ins: list[int], n: int, d_out: int) -> bool:
    """Whether :func:`shared_gram_sq_norms` costs less than each piece on its own (by multiply-adds).

    >>> shared_gram_pays([64, 128], 64, 512), shared_gram_pays([64, 128], 1024, 512)
    (True, False)
    """
    alone = sum(min(n * n * (i + d_out), n * i * d_out) for i in ins)
    return n > 1 and n * n * (sum(ins) + d_out) < alone


def repeat_rows(weights: Tensor, n: int) -> Tensor:
    """Each sample's weight repeated for its ``n`` rows: ``[B] -> [B*n, 1]``.

    >>> repeat_rows(torch.tensor([1.0, 2.0]), 2).flatten().tolist()
    [1.0, 1.0, 2.0, 2.0]
    """
    return weights.repeat_interleave(n).unsqueeze(1)


def linear_weighted_sum(A: Tensor, G: Tensor, weights: Tensor) -> Tensor:
    """``sum_b weights[b] * G_b^T A_b`` in one matrix product: shape ``[out, in]``.

    >>> A, G, w = torch.randn(3, 2, 4), torch.randn(3, 2, 5), torch.rand(3)
    >>> ref = torch.einsum("b,bno,bni->oi", w, G, A)
    >>> torch.allclose(linear_weighted_sum(A, G, w), ref, atol=1e-5)
    True
    """
    B, n, d_in = A.shape
    d_out = G.shape[-1]
    w = weights.to(A.dtype)
    if n > 1 and G.transpose(0, 1).is_contiguous():  # time-major backprops (an RNN's): flatten without a copy
        a, g, rows = (
            A.transpose(0, 1).reshape(n * B, d_in),
            G.transpose(0, 1).reshape(n * B, d_out),
            w.repeat(n)[:, None],
        )
    else:
        a, g, rows = A.reshape(B * n, d_in), G.reshape(B * n, d_out), repeat_rows(w, n)
    if d_in < d_out:
        return torch.mm(g.t(), a * rows)
    return torch.mm((g * rows).t(), a)


def embedding_sq_norms(idx: Tensor, G: Tensor, V: int) -> Tensor:
    """Squared norm of each sample's embedding gradient, by matching indices: shape ``[B]``.

    Sample ``b`` adds ``G[b, t]`` to row ``idx[b, t]``; positions with equal
    indices add up before squaring. One sort (``unique``) finds them all.

    Args:
        idx: ``[B, n]`` indices (positions to leave out already have zero backprops).
        G: ``[B, n, D]`` backprops.
        V: number of embeddings.

    >>> idx = torch.tensor([[1, 1, 2]])
    >>> G = torch.tensor([[[1.0], [2.0], [5.0]]])
    >>> embedding_sq_norms(idx, G, V=3)      # (1 + 2)^2 + 5^2
    tensor([34.])
    """
    B, n = idx.shape
    if B == 0 or n == 0:
        return G.new_zeros(B)
    sample = torch.arange(B, device=idx.device).repeat_interleave(n)
    keys, inverse = torch.unique(sample * V + idx.reshape(-1), return_inverse=True)
    summed = G.new_zeros(keys.shape[0], G.shape[-1]).index_add_(0, inverse, G.reshape(B * n, -1))
    return G.new_zeros(B).index_add_(0, torch.div(keys, V, rounding_mode="floor"), summed.pow(2).sum(1))


def embedding_weighted_sum(idx: Tensor, G: Tensor, weights: Tensor, V: int) -> Tensor:
    """``sum_b weights[b] * (sample b's embedding gradient)``: shape ``[V, D]``.

    >>> embedding_weighted_sum(torch.tensor([[0, 1]]), torch.ones(1, 2, 1), torch.tensor([0.5]), V=2)
    tensor([[0.5000],
            [0.5000]])
    """
    B, n = idx.shape
    rows = repeat_rows(weights.to(G.dtype), n)
    return G.new_zeros(V, G.shape[-1]).index_add_(0, idx.reshape(-1), G.reshape(B * n, -1) * rows)
