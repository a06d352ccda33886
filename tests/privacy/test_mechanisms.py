"""The textbook mechanisms: their output distributions, the two formulas, and the errors for bad input."""

import math

import dp_accounting
import numpy as np
import pytest

from dpnotebook.audit.tradeoff import gaussian_epsilon
from dpnotebook.privacy import (
    amplified_by_subsampling,
    compute_epsilon,
    gaussian_mechanism,
    gaussian_rdp,
    laplace_mechanism,
    randomized_response,
    subsampled_gaussian_rdp,
)

N = 200_000


@pytest.mark.parametrize("p_truth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_randomized_response_reports_one_with_the_right_probability(p_truth: float) -> None:
    rng = np.random.default_rng(1)
    ones = randomized_response(np.ones(N, dtype=int), p_truth=p_truth, rng=rng)
    zeros = randomized_response(np.zeros(N, dtype=int), p_truth=p_truth, rng=rng)
    tolerance = 5 * 0.5 / math.sqrt(N)  # five standard errors of a frequency
    assert abs(ones.mean() - (1 + p_truth) / 2) < tolerance
    assert abs(zeros.mean() - (1 - p_truth) / 2) < tolerance
    assert ones.dtype.kind == "i" and ones.shape == (N,)


def test_laplace_and_gaussian_noise_have_their_scale() -> None:
    rng = np.random.default_rng(2)
    laplace = laplace_mechanism(np.full(N, 3.0), sensitivity=2.0, epsilon=0.5, rng=rng) - 3.0
    assert abs(np.mean(np.abs(laplace)) - 4.0) < 0.05  # E|Laplace(b)| = b = sensitivity / epsilon
    assert abs(np.median(laplace)) < 0.05
    gauss = gaussian_mechanism(np.full(N, -1.0), noise_std=3.0, rng=rng) + 1.0
    assert abs(gauss.std() - 3.0) < 0.03 and abs(gauss.mean()) < 0.03
    assert laplace_mechanism(5.0, sensitivity=1.0, epsilon=1.0, rng=rng).shape == ()


def test_amplification_is_the_formula_and_never_below_the_accountant() -> None:
    assert amplified_by_subsampling(1.5, 1e-5, sample_rate=1.0) == pytest.approx((1.5, 1e-5))
    previous = 0.0
    for q in (1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0):
        eps, delta = amplified_by_subsampling(1.0, 1e-5, sample_rate=q)
        assert eps == pytest.approx(math.log(1 + q * (math.e - 1)), rel=1e-12) and delta == pytest.approx(q * 1e-5)
        assert previous < eps <= 1.0  # grows with q, and subsampling never costs privacy
        previous = eps
    # applied to the Gaussian's exact epsilon, it is tight for one step: the PLD accountant (an upper bound
    # on the true epsilon, as the formula is) gives the same epsilon at q * delta
    for sigma, q in [(1.0, 0.01), (2.0, 0.1), (0.8, 0.3), (1.0, 0.001), (4.0, 0.5)]:
        eps, delta = amplified_by_subsampling(gaussian_epsilon(1 / sigma, 1e-5), 1e-5, sample_rate=q)
        accountant = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=1, delta=delta, accountant="pld")
        assert accountant == pytest.approx(eps, rel=2e-4)


def test_gaussian_rdp_is_dp_accountings_at_every_order() -> None:
    orders = [1.5, 2.0, 3.25, 8.0, 64.0]
    accountant = dp_accounting.rdp.RdpAccountant(orders)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(1.0, dp_accounting.GaussianDpEvent(1.3)), 7)
    ours = 7 * gaussian_rdp(np.array(orders), noise_multiplier=1.3)
    assert ours == pytest.approx(list(accountant._rdp), rel=1e-9)  # private attribute: a cross-check only
    assert gaussian_rdp(5.0, noise_multiplier=0.7) == pytest.approx(subsampled_gaussian_rdp(0.7, 1.0, 5))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda rng: randomized_response([0, 1, 3], p_truth=0.5, rng=rng), "bits=.*other than 0 and 1"),
        (lambda rng: randomized_response([0, 1], p_truth=1.5, rng=rng), r"p_truth=1.5 .*\[0, 1\]"),
        (lambda rng: randomized_response([0, 1], p_truth=0.5, rng=0), "rng=0 is not a numpy Generator"),
        (lambda rng: laplace_mechanism(1.0, sensitivity=1.0, epsilon=0.0, rng=rng), "epsilon=0.0"),
        (lambda rng: laplace_mechanism(1.0, sensitivity=-1.0, epsilon=1.0, rng=rng), "sensitivity=-1.0"),
        (lambda rng: gaussian_mechanism(1.0, noise_std=0.0, rng=rng), "noise_std=0.0"),
        (lambda rng: amplified_by_subsampling(math.inf, 0.0, sample_rate=0.1), "epsilon=inf"),
        (lambda rng: amplified_by_subsampling(1.0, 2.0, sample_rate=0.1), "delta=2.0"),
        (lambda rng: amplified_by_subsampling(1.0, 0.0, sample_rate=0.0), "sample_rate=0.0"),
        (lambda rng: gaussian_rdp(1.0, noise_multiplier=1.0), "alpha=1.0 .*> 1"),
        (lambda rng: gaussian_rdp(2.0, noise_multiplier=0.0), "noise_multiplier=0 .*no finite RDP"),
    ],
)
def test_bad_input_is_named(call, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call(np.random.default_rng(0))
