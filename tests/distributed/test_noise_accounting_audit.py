"""One launch of 2 ranks: the noise is added once, epsilon is counted once, one sample moves the sum by <= C,
secure mode runs per rank, and DDP's own gradient all-reduce is switched off."""

from __future__ import annotations

import pytest
import torch

from dpnotebook.privacy import create_accountant, run_on_ranks
from tests.distributed import workers

STEPS, SIGMA, C = 40, 1.3, 0.7
AUDITS = [
    ("mlp", "gaussian", "hooks", 1),
    ("mlp", "scale_1e4", "ghost", 3),
    ("conv", "duplicated", "hooks", 3),
    ("conv", "scale_1e4", "ghost", 1),
    ("norms", "cancelling_copies", "functorch", 3),
]
EXAMPLE_ARGS = ["--epochs", "1", "--no-progress", "--accountant", "rdp"]
CALLS = [
    ("zero_gradient_noise", (STEPS, SIGMA, C)),
    ("audit_cases", (AUDITS,)),
    ("secure_steps", ()),
    ("ddp_leaves_gradients_alone", ()),
    ("run_example", (EXAMPLE_ARGS,)),
]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    outcomes = run_on_ranks(workers.several, world_size=2, args=(CALLS,), timeout_s=120)
    for outcome in outcomes:
        assert outcome.error is None, outcome.traceback
    return [outcome.value for outcome in outcomes]


def test_noise_is_added_once_per_step_not_once_per_rank(results) -> None:
    grads = [r["zero_gradient_noise"]["grads"] for r in results]
    assert torch.equal(grads[0], grads[1])  # every rank applies the same noisy gradient
    expected_batch = results[0]["zero_gradient_noise"]["expected_batch_size"]
    assert expected_batch == 16.0  # the global q * N = 64 / 4, not a rank's share
    target = SIGMA * C / expected_batch
    measured = float(grads[0].std())
    # 40 steps x 1000 weights = 40000 draws: the std's relative standard error is 1/sqrt(2 * 40000) = 0.35%.
    # 3% is 8 standard errors; noise drawn on both ranks would be sqrt(2) = 41% too large.
    assert abs(measured / target - 1) < 0.03, (measured, target)
    assert abs(float(grads[0].mean())) < 4 * target / (grads[0].numel() ** 0.5)


def test_epsilon_is_the_single_process_epsilon(results) -> None:
    run = results[0]["zero_gradient_noise"]
    assert run["sample_rate"] == 0.25 and run["steps"] == results[1]["zero_gradient_noise"]["steps"] == STEPS
    single = create_accountant("rdp")
    for _ in range(STEPS):
        single.step(noise_multiplier=SIGMA, sample_rate=0.25)
    assert run["epsilon"] == pytest.approx(single.get_epsilon(1e-5), rel=1e-12)
    assert results[1]["zero_gradient_noise"]["epsilon"] == run["epsilon"]


@pytest.mark.parametrize("index", range(len(AUDITS)), ids=["/".join(map(str, a)) for a in AUDITS])
def test_one_sample_moves_the_all_reduced_sum_by_at_most_C(results, index) -> None:
    reports = [r["audit_cases"][index] for r in results]
    assert reports[0]["max_ratio"] == reports[1]["max_ratio"]
    assert reports[0]["ok"], reports[0]["table"]
    assert reports[0]["max_ratio"] > 0.5, reports[0]["table"]  # the samples were clipped and did move the sum
    # the all-reduced S(D) is the one-process float64 definition: no rank's share lost or counted twice
    assert reports[0]["reference_gap"] < 1e-4, reports[0]["table"]


def test_secure_mode_runs_per_rank_and_the_ranks_agree(results) -> None:
    a, b = (r["secure_steps"] for r in results)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(torch.equal(p, q.detach()) for p, q in zip(a, workers.mlp().parameters(), strict=True))


def test_ddp_does_not_all_reduce_the_gradients_again(results) -> None:
    for r in results:  # after backward, p.grad is each rank's own gradient: DDP's hooks did not average it
        assert r["ddp_leaves_gradients_alone"]["gap"] < 1e-12
        assert "GradSampleError" in r["ddp_leaves_gradients_alone"]["refused"]  # the DDP object itself is refused


def test_the_example_on_two_ranks_trains_as_one_process(results) -> None:
    alone = workers.run_example(0, None, EXAMPLE_ARGS)
    ranks = [r["run_example"] for r in results]
    assert ranks[0]["world_size"] == 2 and alone["world_size"] == 1
    for rank in ranks:
        assert rank["steps"] == alone["steps"] == 12 and rank["epsilon"] == alone["epsilon"]
        assert rank["noise_multiplier"] == alone["noise_multiplier"]
        assert (
            abs(rank["accuracy"] - alone["accuracy"]) <= 2 / 359
        )  # float32 sums in another order: a test image or two
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"] > 0.3  # one epoch moved it above chance (10%)
