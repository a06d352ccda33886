"""The hypothesis-testing view of DP against closed forms and dp_accounting."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from dpnotebook.audit import dp_tpr_bound, gaussian_delta, gaussian_epsilon, gaussian_mu, gaussian_tpr, pld_tpr

FPR = np.array([0.0, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0])


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
def test_gaussian_epsilon_matches_dp_accounting(sigma):
    assert gaussian_epsilon(1 / sigma, 1e-5) == pytest.approx(
        dp_accounting.get_epsilon_gaussian(sigma, 1e-5), rel=1e-5, abs=1e-6
    )


@pytest.mark.parametrize("mu", [0.2, 1.0, 3.0])
def test_gaussian_tradeoff_is_the_threshold_tests_roc(mu):
    # threshold t on N(0,1) vs N(mu,1): FPR = 1 - Phi(t), TPR = 1 - Phi(t - mu)
    t = np.linspace(-3, 5, 50)
    np.testing.assert_allclose(gaussian_tpr(norm.sf(t), mu), norm.sf(t - mu), atol=1e-12)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3, 0.05])
def test_gaussian_curve_lies_under_its_dp_bound_and_touches_it(mu, delta):
    eps = gaussian_epsilon(mu, delta)
    grid = np.linspace(0, 1, 20001)
    gap = dp_tpr_bound(grid, eps, delta) - gaussian_tpr(grid, mu)
    assert gap.min() >= -1e-9  # (eps, delta)-DP holds ...
    assert gap.min() < 1e-3  # ... and is tight: the curve touches the bound
    # a smaller epsilon does not hold: the curve crosses its bound
    assert (dp_tpr_bound(grid, 0.9 * eps, delta) - gaussian_tpr(grid, mu)).min() < 0


@pytest.mark.parametrize("sigma", [0.01, 0.02])
def test_gaussian_epsilon_of_little_noise_is_computed_not_an_overflow(sigma):
    # before: exp(epsilon) overflowed for epsilon > 709 (OverflowError), e.g. AttackState(noise_multiplier=0.02)
    eps = gaussian_epsilon(1 / sigma, 1e-5)
    assert eps == pytest.approx({0.01: 5425.51, 0.02: 1462.285}[sigma], rel=1e-4)  # mpmath, 60 digits
    assert gaussian_delta(eps, 1 / sigma) == pytest.approx(1e-5, rel=1e-6)


def test_dp_bound_of_a_huge_epsilon_is_computed_not_an_overflow():
    # before: math.exp(1000) raised OverflowError (the attack explorer's bound for a barely private run)
    bound = dp_tpr_bound(np.array([0.0, 1e-300, 0.5]), 1000.0, 1e-5)
    assert bound.tolist() == [1e-5, 1.0, 1.0]


def test_gaussian_delta_closed_form():
    assert gaussian_delta(0.0, 1.0) == pytest.approx(2 * norm.cdf(0.5) - 1)
    assert gaussian_mu(sensitivity=2.0, noise_std=4.0) == 0.5


@pytest.mark.parametrize("mu", [30.0, 100.0])
def test_gaussian_epsilon_of_a_large_mu_is_finite(mu):
    # e^epsilon overflows a float past epsilon = 709: delta is computed in log space, not refused
    eps = gaussian_epsilon(mu, 1e-5)
    assert mu**2 / 2 < eps < mu**2 / 2 + 5 * mu and gaussian_delta(eps, mu) == pytest.approx(1e-5, rel=1e-6)


def test_dp_bound_closed_form():
    eps, delta = math.log(3), 0.01
    a = np.array([0.0, 0.1, 0.2, 0.9])
    expected = np.minimum(np.minimum(3 * a + delta, 1 - (1 - a - delta) / 3), 1)
    np.testing.assert_allclose(dp_tpr_bound(a, eps, delta), expected)
    assert dp_tpr_bound(1.0, 0.0, 0.0) == 1.0


@pytest.mark.parametrize("sigma", [0.7, 1.0, 3.0])
def test_pld_curve_of_one_full_batch_step_is_gaussian(sigma):
    got = pld_tpr(FPR, noise_multiplier=sigma)
    want = gaussian_tpr(FPR, 1 / sigma)
    assert (got - want).min() >= -1e-9  # pessimistic: never below the true curve
    assert np.abs(got - want).max() < 2e-3


def test_pld_curve_of_composed_steps_is_gaussian_with_sqrt_steps():
    # k full-batch Gaussian steps compose to mu = sqrt(k) / sigma exactly
    got = pld_tpr(FPR, noise_multiplier=2.0, steps=4)
    assert np.abs(got - gaussian_tpr(FPR, 1.0)).max() < 3e-3


def test_pld_curve_within_the_accountants_epsilon():
    from dpnotebook.privacy import compute_epsilon

    kw = dict(noise_multiplier=1.0, sample_rate=0.05, steps=200)
    eps = compute_epsilon(**kw, delta=1e-5, accountant="pld")
    grid = np.linspace(0, 1, 2001)
    curve = pld_tpr(grid, **kw)
    assert (dp_tpr_bound(grid, eps, 1e-5) - curve).min() >= -2e-3
    assert curve[1] > grid[1]  # and the run is not perfectly private


@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: gaussian_tpr(1.5, 1.0), "fpr=1.5 is invalid"),
        (lambda: gaussian_tpr(0.1, -1.0), "mu=-1.0 is invalid"),
        (lambda: gaussian_epsilon(1.0, 0.0), "delta=0.0 is invalid"),
        (lambda: gaussian_mu(sensitivity=1.0, noise_std=0.0), "noise_std=0.0 is invalid"),
        (lambda: dp_tpr_bound(0.1, -1.0, 0.0), "epsilon=-1.0"),
        (lambda: pld_tpr(0.1, noise_multiplier=1.0, sample_rate=0.0), "sample_rate=0.0 is invalid"),
        (lambda: pld_tpr(0.1, noise_multiplier=1.0, steps=0), "steps=0 is invalid"),
    ],
)
def test_bad_input_named(call, text):
    with pytest.raises(ValueError, match=text):
        call()


@pytest.mark.parametrize("eps, delta", [(1.0, 0.0), (math.log(3), 0.01), (4.0, 1e-5)])
def test_dp_bound_is_the_two_hypothesis_testing_inequalities(eps, delta):
    # (eps, delta)-DP <=> TPR <= e^eps FPR + delta and 1 - TPR >= e^-eps (1 - FPR - delta)
    rng = np.random.default_rng(0)
    fpr, tpr = rng.random(20000), rng.random(20000)
    allowed = (tpr <= math.exp(eps) * fpr + delta) & (1 - tpr >= math.exp(-eps) * (1 - fpr - delta))
    np.testing.assert_array_equal(allowed, tpr <= dp_tpr_bound(fpr, eps, delta))


def test_the_printed_wrong_inequality_admits_a_point_dp_forbids():
    # issue #29: "1 - FPR >= e^-eps (1 - TPR - delta)" lets FPR 0.5, TPR 0.9 through at eps 1
    fpr, tpr, eps = 0.5, 0.9, 1.0
    assert tpr <= math.exp(eps) * fpr and 1 - fpr >= math.exp(-eps) * (1 - tpr)  # the wrong pair
    bound = float(dp_tpr_bound(fpr, eps, 0.0))
    assert bound == pytest.approx(0.816, abs=1e-3) and bound < tpr


@pytest.mark.parametrize("eps, delta", [(0.2, 0.0), (1.0, 1e-3), (8.0, 1e-5)])
def test_the_two_lines_cross_where_the_advantage_is_largest(eps, delta):
    from dpnotebook.audit import advantage_bound

    cross = (1 - delta) / (math.exp(eps) + 1)
    first = math.exp(eps) * cross + delta
    second = 1 - math.exp(-eps) * (1 - cross - delta)
    assert first == pytest.approx(second, abs=1e-12)
    grid = np.linspace(0, 1, 200001)
    assert (dp_tpr_bound(grid, eps, delta) - grid).max() == pytest.approx(advantage_bound(eps, delta), abs=1e-5)
    assert first - cross == pytest.approx(advantage_bound(eps, delta), abs=1e-12)
