"""A rank that raises ends the run with a clear error on every rank, and nothing waits for a timeout."""

from __future__ import annotations

import pytest

from dpnotebook.privacy import run_on_ranks
from tests.distributed import workers


@pytest.fixture(scope="module")
def outcomes() -> list:
    # A rank left waiting in a collective would wait collective_timeout_s = 300 s: the run's own bound,
    # timeout_s = 100 s, would end it first with a TimeoutError, failing every test here.
    return run_on_ranks(workers.failures, world_size=2, timeout_s=100, collective_timeout_s=300)


def test_each_scenario(outcomes) -> None:
    rank0, rank1 = outcomes
    assert rank0.error is None, rank0.traceback
    seen0 = rank0.value
    # 1. rank 1's forward raised inside fail_together: rank 0, waiting in the all-reduce, stops with the rank named
    assert seen0["forward"].startswith("RanksFailedError: rank(s) [1] raised during this DP step"), seen0
    # 2. rank 1 raised inside its step: rank 0 stops the same way
    assert seen0["step"].startswith("RanksFailedError: rank(s) [1] raised during this DP step"), seen0
    # 3. rank 1's process ended: rank 0's all-reduce fails at once and says why
    assert seen0["death"].startswith("RanksFailedError: rank 0: the all-reduce of the clipped sums failed"), seen0
    # rank 1 saw its own errors: the bad shape, the two-batch refusal, then it raised out of its function
    assert rank1.error.startswith("ValueError: rank 1 stops on bad input"), rank1
    assert "mat1 and mat2 shapes cannot be multiplied" in rank1.error, rank1.error
    assert "one optimizer step clipped the samples of 2 Poisson batches" in rank1.error, rank1.error
