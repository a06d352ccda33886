"""The original RDP conversion: per-order RDP as dp_accounting computes it, and never below the tighter ε."""

import dp_accounting
import pytest

from dpnotebook.privacy import classic_rdp_epsilon, compute_epsilon, subsampled_gaussian_rdp


@pytest.mark.parametrize("sigma, q", [(1.1, 256 / 60000), (0.8, 0.05), (4.0, 0.01), (1.0, 1.0)])
def test_rdp_matches_dp_accounting_at_integer_orders(sigma: float, q: float) -> None:
    orders = [2, 3, 5, 9, 16, 32, 64]
    accountant = dp_accounting.rdp.RdpAccountant(orders)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    ours = [subsampled_gaussian_rdp(sigma, q, a) for a in orders]
    assert ours == pytest.approx(list(accountant._rdp), rel=1e-9)  # private attribute: a cross-check only


def test_classic_is_never_tighter_than_the_accountant() -> None:
    for sigma, q, steps in [(1.1, 256 / 60000, 14062), (1.0, 0.01, 1000), (2.0, 0.1, 100)]:
        tight = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5, accountant="rdp")
        assert classic_rdp_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5) > tight


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="alpha=1.5"):
        subsampled_gaussian_rdp(1.0, 0.1, 1.5)
    with pytest.raises(ValueError, match="delta=0"):
        classic_rdp_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=1, delta=0)
