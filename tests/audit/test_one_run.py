"""The one-run empirical epsilon: a lower bound that never passes the accountant's, and that sees no noise.

Many seeds are cheap on the Gaussian mechanism (the canaries' scores are its output); a few
DP-SGD runs on digits check the same on a trained model.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import binom

from dpnotebook.audit import (
    audit_one_run,
    default_guesses,
    dp_sgd_canary_scores,
    draw_inclusion,
    gaussian_epsilon,
    gaussian_mechanism_scores,
    mislabeled_canaries,
    one_run_epsilon,
    one_run_p_value,
)
from dpnotebook.privacy import compute_epsilon

DELTA = 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_p_value_without_delta_is_a_binomial_tail():
    p = math.exp(1.0) / (1 + math.exp(1.0))
    assert one_run_p_value(canaries=50, guesses=20, correct=17, epsilon=1.0) == pytest.approx(binom.sf(16, 20, p))


def test_p_value_grows_with_epsilon_and_delta():
    kw = dict(canaries=1000, guesses=100, correct=80)
    values = [one_run_p_value(**kw, epsilon=e) for e in (0.0, 0.5, 1.0, 2.0)]
    assert values == sorted(values)
    assert one_run_p_value(**kw, epsilon=1.0, delta=1e-3) > one_run_p_value(**kw, epsilon=1.0)


def test_epsilon_is_the_root_of_the_p_value():
    eps = one_run_epsilon(canaries=1000, guesses=200, correct=170, delta=DELTA, significance=0.05)
    assert one_run_p_value(canaries=1000, guesses=200, correct=170, epsilon=eps, delta=DELTA) == pytest.approx(
        0.05, rel=1e-3
    )
    assert one_run_epsilon(canaries=1000, guesses=200, correct=100) == 0.0


@pytest.mark.slow  # many Monte-Carlo runs
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_gaussian_mechanism_bound_never_exceeds_the_true_epsilon(sigma):
    true_eps = gaussian_epsilon(1 / sigma, DELTA)
    bounds = []
    for seed in range(100):
        included = draw_inclusion(1000, seed=seed)
        scores = gaussian_mechanism_scores(included, noise_multiplier=sigma, seed=10_000 + seed)
        bounds.append(audit_one_run(scores, included, delta=DELTA).epsilon)
    bounds = np.array(bounds)
    assert bounds.max() <= true_eps
    assert bounds.max() <= compute_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=1, delta=DELTA)
    assert np.median(bounds) > 0.1 * true_eps  # the audit sees the mechanism at all


@pytest.mark.slow  # many Monte-Carlo runs
@pytest.mark.parametrize("sigma, q, steps", [(0.6, 0.5, 4), (1.0, 0.1, 100), (2.0, 0.5, 20)])
def test_dp_sgd_gradient_canaries_bound_never_exceeds_the_accountant(sigma, q, steps):
    accountant_eps = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    bounds = []
    for seed in range(100):
        included = draw_inclusion(1000, seed=seed)
        scores = dp_sgd_canary_scores(included, noise_multiplier=sigma, sample_rate=q, steps=steps, seed=seed + 7)
        bounds.append(audit_one_run(scores, included, delta=DELTA).epsilon)
    assert max(bounds) <= accountant_eps
    assert np.median(bounds) > 0.05 * accountant_eps


def test_dp_sgd_gradient_canaries_without_noise():
    included = draw_inclusion(1000, seed=1)
    scores = dp_sgd_canary_scores(included, noise_multiplier=0.0, sample_rate=0.5, steps=20, seed=2)
    assert audit_one_run(scores, included, delta=DELTA).epsilon > 4


def test_the_test_can_fail_an_accountant_that_undercounts():
    # claim sigma=0.5 spends what sigma=2 spends: the audit refutes it in most runs
    claimed = gaussian_epsilon(1 / 2.0, DELTA)
    refuted = 0
    for seed in range(20):
        included = draw_inclusion(1000, seed=seed)
        scores = gaussian_mechanism_scores(included, noise_multiplier=0.5, seed=seed + 99)
        refuted += audit_one_run(scores, included, delta=DELTA).epsilon > claimed
    assert refuted >= 15


def test_no_noise_gives_a_large_epsilon():
    included = draw_inclusion(1000, seed=0)
    run = audit_one_run(gaussian_mechanism_scores(included, noise_multiplier=0.0), included, delta=DELTA)
    assert run.correct == run.guesses and run.epsilon > 4


def test_the_bound_pays_for_the_guesses_it_tries():
    included = draw_inclusion(1000, seed=3)
    scores = gaussian_mechanism_scores(included, noise_multiplier=1.0, seed=4)
    alone = audit_one_run(scores, included, delta=DELTA, guesses=[(100, 100)])
    among = audit_one_run(scores, included, delta=DELTA, guesses=[(100, 100)] + [(k, 0) for k in range(1, 20)])
    assert among.tried == 20
    assert among.epsilon <= alone.epsilon or (among.guesses_in, among.guesses_out) != (100, 100)


def test_default_guesses_and_bad_input():
    assert all(k_in + k_out <= 10 for k_in, k_out in default_guesses(10))
    with pytest.raises(ValueError, match="one finite score and one inclusion flag per canary"):
        audit_one_run([1.0, 2.0], np.array([True]))
    with pytest.raises(ValueError, match="as booleans"):
        audit_one_run([1.0, 2.0], np.array([1, 0]))
    with pytest.raises(ValueError, match=r"k\+=3, k-=0\) is invalid for 2 canaries"):
        audit_one_run([1.0, 2.0], np.array([True, False]), guesses=[3])
    with pytest.raises(ValueError, match="significance=0.0 is invalid"):
        one_run_epsilon(canaries=10, guesses=5, correct=5, significance=0.0)
    with pytest.raises(ValueError, match="correct=6 is invalid"):
        one_run_p_value(canaries=10, guesses=5, correct=6, epsilon=1.0)


def test_mislabeled_canaries_keep_inputs_change_labels():
    x, y = torch.randn(50, 3), torch.randint(0, 4, (50,))
    cx, cy = mislabeled_canaries(x, y, num_classes=4, seed=1)
    assert torch.equal(cx, x) and bool((cy != y).all()) and int(cy.max()) < 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dp_sgd_on_digits_bound_below_the_accountant(seed):
    from dpnotebook.audit import audited_digits_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = audited_digits_run(noise_multiplier=0.8, members=200, canaries=400, epochs=8, seed=seed)
    assert math.isfinite(run.epsilon)
    assert run.one_run.epsilon <= run.epsilon


def test_dp_sgd_without_noise_gives_a_clearly_positive_epsilon():
    from dpnotebook.audit import audited_digits_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = audited_digits_run(noise_multiplier=0.0, members=200, canaries=400, epochs=40, lr=4.0, seed=0)
    assert run.epsilon == math.inf
    assert run.one_run.epsilon > 1.0


def test_the_epsilon_returned_is_refuted_not_just_near_the_root():
    # the bound is the largest refuted epsilon: its own p-value must be at most the significance
    cases = [(1000, 200, 170, DELTA), (1000, 600, 600, DELTA), (50, 10, 9, 0.0), (200, 100, 80, 1e-3)]
    for m, r, v, delta in cases:
        eps = one_run_epsilon(canaries=m, guesses=r, correct=v, delta=delta, significance=0.05)
        assert eps > 0
        assert one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta) <= 0.05


@pytest.mark.parametrize("eps, guesses, delta", [(1.0, 100, 0.0), (0.3, 500, 0.0), (2.0, 40, 1e-4)])
def test_the_bound_holds_exactly_against_randomized_response(eps, guesses, delta):
    # eps-randomized response on each coin is eps-DP and makes each guess right with probability
    # e^eps / (1 + e^eps), independently: right ~ Binomial(guesses, p) exactly, so the chance that the
    # bound passes the true eps is a finite sum: at most the significance, and close to it without delta.
    p = 1 / (1 + math.exp(-eps))
    right = np.arange(guesses + 1)
    refuted = [one_run_epsilon(canaries=1000, guesses=guesses, correct=int(v), delta=delta) > eps for v in right]
    chance = float(binom.pmf(right, guesses, p)[refuted].sum())
    assert chance <= 0.05 and (delta > 0 or chance > 0.01)


def test_a_tight_pure_dp_mechanism_is_refuted_at_most_at_the_significance():
    # randomized response on each coin is exactly eps-DP and each "in" guess is right with probability
    # e^eps / (1 + e^eps): the one-run bound passes the true eps in at most 5% of runs, and close to it
    eps, m, runs = 1.0, 1000, 400
    over = 0
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        answer = np.where(rng.random(m) < 1 / (1 + math.exp(-eps)), included, ~included)
        scores = answer + 0.01 * rng.random(m)  # ties broken by noise independent of the coins
        over += audit_one_run(scores, included, guesses=[(100, 0)]).epsilon > eps
    assert 0.01 * runs < over <= (0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)) * runs
