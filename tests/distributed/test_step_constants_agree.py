"""Every step's sigma, C, divisor and weights agree across ranks, also when one rank changes them after make_private.

Before, rank 1 setting ``max_grad_norm = 3.0`` after its first step (a clipping scheduler stepped, or a
checkpoint's scheduler state loaded, on one rank only) went unnoticed: rank 1's samples were clipped at
3 C while rank 0 added noise calibrated to C, and rank 1's accountant counted a sigma no rank used.
"""

from __future__ import annotations

import pytest

from dpnotebook.privacy import run_on_ranks
from tests.distributed import workers

DISAGREE, WEIGHTS = "RanksFailedError: the ranks' DP steps disagree", "RanksFailedError: the ranks' weights differ"
CHANGES = [
    ("max_grad_norm", 3.0, DISAGREE, "max_grad_norm: rank 0: 1.0, rank 1: 3.0"),
    ("noise_multiplier", 0.5, DISAGREE, "noise_multiplier: rank 0: 1.0, rank 1: 0.5"),
    ("expected_batch_size", 12.0, DISAGREE, "mean divisor: rank 0: 6.0, rank 1: 12.0"),
    # weights changed on rank 1 alone after wrapping (a checkpoint loaded there only): before, the replicas
    # trained apart without a word
    ("weights", 1e-3, WEIGHTS, "weights: rank 0: "),
]


@pytest.fixture(scope="module")
def outcomes() -> list:
    changes = [(knob, value) for knob, value, _, _ in CHANGES]
    result = run_on_ranks(workers.knob_changed_on_one_rank, world_size=2, args=(changes,), timeout_s=120)
    for outcome in result:
        assert outcome.error is None, outcome.traceback
    return result


@pytest.mark.parametrize("index", range(len(CHANGES)), ids=[c[0] for c in CHANGES])
def test_a_knob_changed_on_one_rank_is_refused_on_every_rank(outcomes, index) -> None:
    seen = [outcome.value[index] for outcome in outcomes]
    assert seen[0] == seen[1], seen
    _, _, start, line = CHANGES[index]
    assert seen[0].startswith(start), seen[0]
    assert line in seen[0] and "Fix:" in seen[0], seen[0]
