"""The forms the per-sample work takes inside ``capturable_step()`` (a step a CUDA graph captures).

Each is checked against the form that reads the device, and against the float64 definition: the embedding
norms must be equal, and a guarded Gram norm may only be larger (never clip a sample less than its norm).
"""

from __future__ import annotations

import pytest
import torch

from dpnotebook.grad_sample._engine.capturable import capturable_step, host_reads_allowed
from dpnotebook.grad_sample.samplers.linear_norm import embedding_sq_norms, embedding_sq_norms_fixed, guard_gram


def embedding_oracle(idx, G, V):
    """Each sample's embedding gradient formed in float64 ([B, V, D]), then its squared norm."""
    B, n = idx.shape
    grads = torch.zeros(B, V, G.shape[-1], dtype=torch.float64, device="cpu")  # the CPU, whatever the default
    for b in range(B):
        grads[b].index_add_(0, idx[b], G[b].double())
    return grads.flatten(1).pow(2).sum(1)


@pytest.mark.parametrize(("B", "n", "V"), [(1, 1, 3), (4, 6, 3), (5, 7, 50), (3, 9, 2)])
def test_the_fixed_embedding_norms_are_the_unique_ones(B, n, V):
    g = torch.Generator().manual_seed(B * 100 + n)
    idx = torch.randint(0, V, (B, n), generator=g)
    G = torch.randn(B, n, 4, generator=g)
    fixed, unique = embedding_sq_norms_fixed(idx, G, V), embedding_sq_norms(idx, G, V)
    assert torch.allclose(fixed, unique, rtol=1e-5, atol=1e-6)
    assert torch.allclose(fixed.double().cpu(), embedding_oracle(idx.cpu(), G.cpu(), V), rtol=1e-5, atol=1e-6)
    with capturable_step():
        assert not host_reads_allowed()
        assert torch.equal(embedding_sq_norms(idx, G, V), fixed)
    assert host_reads_allowed()


def test_the_guard_without_reads_never_gives_less_than_the_guard():
    """Samples 0-1 cancel to 1e-12 of their bound (suspect), sample 2 is ordinary, sample 3 has a NaN."""
    A = torch.full((4, 2, 64), 1000.0)
    A[:, 1, 0] += torch.tensor([0.01, 0.03, 0.0, 0.0])
    G = torch.ones(4, 2, 64)
    G[:2, 1] = -1.0
    torch.manual_seed(0)
    A[2], G[2] = torch.randn(2, 64), torch.randn(2, 64)
    A[3, 0, 0] = float("nan")
    sq = (A @ A.mT * (G @ G.mT)).sum((1, 2))  # the float32 Gram norms the guard checks
    read = guard_gram(A, G, sq)
    with capturable_step():
        fixed = guard_gram(A, G, sq)
    exact = torch.bmm(G.double().mT, A.double()).flatten(1).pow(2).sum(1)
    assert torch.equal(fixed[2], read[2]) and torch.equal(fixed[2], sq[2])  # not suspect: untouched
    for b in (0, 1):
        assert read[b] <= fixed[b] <= 1.06 * read[b], (b, read[b], fixed[b])
        assert fixed[b] >= exact[b]
    assert torch.isnan(fixed[3]) and torch.isnan(read[3])  # the step's finite mask drops it
