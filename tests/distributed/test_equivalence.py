"""Two ranks give the parameters of one process trained on the union of their batches (same seeds).

With sigma = 0, and also with sigma > 0: rank 0 draws the noise from the same seeded
generator as the single process does.
"""

from __future__ import annotations

import pytest
import torch

from dpnotebook.privacy import run_on_ranks
from tests.distributed import workers

CASES = [
    *[dict(mode=mode, K=K) for mode in ("hooks", "ghost", "functorch", "ew") for K in (1, 3)],
    dict(mode="hooks", K=3, physical=1),  # BatchMemoryManager per rank, pieces of 1 sample
    dict(mode="ghost", K=1, physical=2),
    dict(mode="hooks", K=1, wrapper="ddp"),  # plain DistributedDataParallel, recognised
    dict(mode="ghost", K=3, clipping="per_layer"),
    dict(mode="hooks", K=1, batch_size=1, steps=6),  # q = 1/24: per-rank batches are often empty
    dict(mode="ghost", K=3, batch_size=1, steps=6),
    dict(mode="hooks", K=1, sigma=1.0, seed=5),  # seeded noise, drawn by rank 0: as in one process
    dict(mode="hooks", K=1, sigma=1.0, seed=5),  # ... run again from fresh generators
]


@pytest.fixture(scope="module")
def outcomes() -> list:
    result = run_on_ranks(workers.train_cases, world_size=2, args=(CASES,), timeout_s=120)
    for outcome in result:
        assert outcome.error is None, outcome.traceback
    return result


@pytest.mark.filterwarnings("ignore:Poisson sampling drew an empty batch")  # the q = 1/24 cases, on purpose
@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_two_ranks_match_one_process_on_the_union(outcomes, index) -> None:
    case = CASES[index]
    single = workers.train(None, **case)
    ranks = [outcome.value[index] for outcome in outcomes]
    for rank in ranks:
        assert rank["steps"] == single["steps"] > 0  # the accountant counts logical steps once
        for p, q in zip(rank["params"], ranks[0]["params"], strict=True):
            assert torch.equal(p, q)  # the ranks stay in sync, bit for bit
    union = [a + b for a, b in zip(ranks[0]["sizes"], ranks[1]["sizes"], strict=True)]
    assert union == single["sizes"]  # the same examples were sampled
    assert ranks[0]["global"] == union[-1]
    for p, q in zip(ranks[0]["params"], single["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)  # float64: only the summation order differs
    moved = sum(
        float((p - q.detach()).abs().max()) for p, q in zip(ranks[0]["params"], workers.mlp().parameters(), strict=True)
    )
    assert moved > 1e-3  # training did change the weights


def test_empty_batches_happened_on_some_rank(outcomes) -> None:
    for index, case in enumerate(CASES):
        if case.get("batch_size") == 1:
            sizes = [outcome.value[index]["sizes"] for outcome in outcomes]
            assert 0 in sizes[0] + sizes[1], sizes


def test_seeded_runs_repeat(outcomes) -> None:
    first, again = (outcomes[0].value[CASES.index(case)] for case in (CASES[-2], CASES[-1]))
    for p, q in zip(first["params"], again["params"], strict=True):
        assert torch.equal(p, q)
