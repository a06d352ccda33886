"""Distributed ranks agree (issue #28.5): one all-gather at make_private, a mismatch refused on every rank.

Before, per-rank loaders of batch sizes 4 and 12 over the 24 examples sampled at q = 1/6 and
1/2: rank 0 reported epsilon 4.26 (RDP, sigma 1, 6 steps) while rank 1's examples spent 8.98
(RDP; 8.11 with PLD), and the replicas drifted apart (largest parameter gap 0.168).
"""

from __future__ import annotations

import pytest
import torch

from dpnotebook.privacy import run_on_ranks
from tests.distributed import workers

SCENARIOS: list[tuple[list[dict], int, list[str]]] = [
    # (settings of rank 0 and rank 1, steps to train, what the refusal must name; [] = agree)
    (
        [{"batch_size": 4}, {"batch_size": 12}],
        0,
        ["sample_rate: rank 0: 0.16666666666666666, rank 1: 0.5", "steps_per_epoch: rank 0: 6, rank 1: 2"],
    ),
    ([{"noise_multiplier": 1.0}, {"noise_multiplier": 1.1}], 0, ["noise_multiplier: rank 0: 1.0, rank 1: 1.1"]),
    ([{"max_grad_norm": 0.3}, {"max_grad_norm": 0.5}], 0, ["max_grad_norm: rank 0: 0.3, rank 1: 0.5"]),
    ([{"grad_sample_mode": "hooks"}, {"grad_sample_mode": "ghost"}], 0, ["grad_sample_mode: rank 0: 'hooks'"]),
    ([{"K": 1}, {"K": 2}], 0, ["K: rank 0: 1, rank 1: 2"]),
    (
        [{"accountant": "rdp"}, {"accountant": "pld"}],
        0,
        ["accountant: rank 0: 'RDPAccountant', rank 1: 'PLDAccountant'"],
    ),
    ([{"clipping": "flat"}, {"clipping": "per_layer"}], 0, ["clipping: rank 0: 'flat', rank 1: 'per_layer'"]),
    ([{"loss_reduction": "mean"}, {"loss_reduction": "sum"}], 0, ["loss_reduction: rank 0: 'mean', rank 1: 'sum'"]),
    # each rank its own half of the 24 examples (a per-rank Subset, or a slice of the tensors): before, the
    # sizes, q and every other setting agreed, and each rank Poisson-sampled a shard of its own half, so 12 of
    # the 24 examples could never be drawn
    ([{"subset": 0}, {"subset": 1}], 0, ["dataset: rank 0: 'Subset of 12 examples #", "rank 1: 'Subset of 12"]),
    ([{"slice": 0}, {"slice": 1}], 0, ["dataset: rank 0: 'TensorDataset of 12 examples #"]),
    ([{"subset": 1}, {"subset": 1}], 6, []),  # the same Subset on every rank is one dataset
    ([{"batch_size": 4}, {"batch_size": 4}], 6, []),
]


@pytest.fixture(scope="module")
def outcomes():
    scenarios = [(settings, steps) for settings, steps, _ in SCENARIOS]
    return run_on_ranks(workers.uneven_scenarios, world_size=2, args=(scenarios,), timeout_s=240)


def test_no_rank_fails_outside_make_private(outcomes) -> None:
    assert [o.error for o in outcomes] == [None, None], [o.traceback for o in outcomes]


@pytest.mark.parametrize("index", range(len(SCENARIOS)))
def test_a_mismatch_is_refused_on_every_rank_naming_ranks_and_values(outcomes, index) -> None:
    _, _, named = SCENARIOS[index]
    results = [o.value[index] for o in outcomes]
    if not named:  # the ranks agree: they train, report the same epsilon and stay identical
        assert [r["refused"] for r in results] == ["", ""]
        assert results[0]["epsilon"] == results[1]["epsilon"]
        assert all(torch.equal(p, q) for p, q in zip(results[0]["params"], results[1]["params"], strict=True))
        return
    refusals = [r["refused"] for r in results]
    assert refusals[0] == refusals[1] and "called make_private with different settings" in refusals[0]
    for text in named:
        assert text in refusals[0]
    assert "Fix: give every rank the same data_loader" in refusals[0]
