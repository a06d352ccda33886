"""Accounting: epsilon is dp_accounting's own, the noise search re-checks, sigma is calibrated for the steps the
loader runs, the state round-trips, and the original RDP conversion is never tighter."""

from __future__ import annotations

import io
import math
import time

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import (
    DPDataLoader,
    PLDAccountant,
    PrivacyEngine,
    RDPAccountant,
    available_accountants,
    classic_rdp_epsilon,
    compute_epsilon,
    create_accountant,
    get_noise_multiplier,
    steps_for_epochs,
    steps_per_epoch,
    subsampled_gaussian_rdp,
)

# The TF-Privacy / Opacus MNIST setting.
Q, SIGMA, EPOCHS, DELTA = 256 / 60000, 1.1, 60, 1e-5
STEPS = int(EPOCHS / Q)  # 14062


def direct(dp_acc: dp_accounting.PrivacyAccountant, history) -> dp_accounting.PrivacyAccountant:
    for sigma, q, n in history:
        dp_acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n)
    return dp_acc


def test_mnist_epsilon_rdp_equals_dp_accounting():
    acc = create_accountant("rdp")
    acc.step(noise_multiplier=SIGMA, sample_rate=Q, num_steps=STEPS)
    reference = direct(dp_accounting.rdp.RdpAccountant(), [(SIGMA, Q, STEPS)])
    assert acc.get_epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    # dp_accounting converts RDP to (eps, delta) with the tight conversion: 2.60.
    assert 2.55 < acc.get_epsilon(DELTA) < 2.65
    # The often-quoted 2.9-3.0 is the classic conversion eps = rdp + log(1/delta)/(alpha - 1).
    classic = np.min(reference.rdp + math.log(1 / DELTA) / (reference.orders - 1))
    assert 2.9 < classic < 3.05


def test_mnist_epsilon_pld_equals_dp_accounting():
    acc = create_accountant("pld")
    acc.step(noise_multiplier=SIGMA, sample_rate=Q, num_steps=STEPS)
    reference = direct(dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3), [(SIGMA, Q, STEPS)])
    assert acc.get_epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    assert 2.3 < acc.get_epsilon(DELTA) < 2.45  # tighter than RDP
    assert create_accountant("prv").get_epsilon(DELTA) == 0.0  # "prv" is the PLD accountant
    assert isinstance(create_accountant("prv"), PLDAccountant)


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_history_with_changing_sigma_and_q(name):
    acc = create_accountant(name)
    for _ in range(20):
        acc.step(noise_multiplier=1.0, sample_rate=0.01)
    acc.step(noise_multiplier=1.0, sample_rate=0.01, num_steps=10)
    acc.step(noise_multiplier=0.8, sample_rate=0.02, num_steps=20)
    acc.step(noise_multiplier=1.0, sample_rate=0.01, num_steps=5)
    assert acc.history == [(1.0, 0.01, 30), (0.8, 0.02, 20), (1.0, 0.01, 5)]
    assert len(acc) == 55
    fresh = RDPAccountant().new_dp_accountant() if name == "rdp" else PLDAccountant().new_dp_accountant()
    assert acc.get_epsilon(1e-5) == pytest.approx(direct(fresh, acc.history).get_epsilon(1e-5), rel=1e-12)


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_noise_multiplier_rechecks_at_or_under_target(name):
    target, q = 2.0, 0.02
    sigma = get_noise_multiplier(target_epsilon=target, target_delta=1e-5, sample_rate=q, epochs=5, accountant=name)
    eps = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=250, delta=1e-5, accountant=name)
    assert target - 0.01 <= eps <= target
    slightly_less = compute_epsilon(
        noise_multiplier=sigma * 0.98, sample_rate=q, steps=250, delta=1e-5, accountant=name
    )
    assert slightly_less > target


def test_noise_multiplier_for_mnist_and_cache():
    start = time.perf_counter()
    sigma = get_noise_multiplier(target_epsilon=3.0, target_delta=DELTA, sample_rate=Q, epochs=EPOCHS, accountant="rdp")
    first = time.perf_counter() - start
    start = time.perf_counter()
    steps = steps_for_epochs(EPOCHS, steps_per_epoch(Q))  # 60 epochs of round(1 / q) = 234 batches: 14040
    again = get_noise_multiplier(target_epsilon=3.0, target_delta=DELTA, sample_rate=Q, steps=steps, accountant="rdp")
    assert again == sigma and time.perf_counter() - start < first / 10 + 1e-3
    assert 0.95 < sigma < 1.1  # eps(1.1) = 2.6 < 3


def test_state_dict_round_trip_through_torch_save():
    acc = create_accountant("rdp")
    acc.step(noise_multiplier=1.0, sample_rate=0.01, num_steps=100)
    acc.step(noise_multiplier=2.0, sample_rate=0.01, num_steps=10)
    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    restored = create_accountant("rdp")
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.history == acc.history
    assert restored.get_epsilon(1e-5) == acc.get_epsilon(1e-5)


def test_registry_and_zero_noise():
    assert available_accountants() == ["pld", "prv", "rdp"]
    for name in ("rdp", "pld"):
        acc = create_accountant(name)
        acc.step(noise_multiplier=0.0, sample_rate=0.1)
        assert acc.get_epsilon(1e-5) == math.inf
    acc = create_accountant("rdp")
    epsilons = []
    for _ in range(3):
        acc.step(noise_multiplier=1.0, sample_rate=0.05, num_steps=50)
        epsilons.append(acc.get_epsilon(1e-5))
    assert epsilons == sorted(epsilons) and epsilons[0] < epsilons[-1]


def test_rdp_non_convergence_warnings_are_held_back(caplog):
    """dp_accounting logs one warning per left-out order at small sigma and large q; they must not reach the user."""
    import logging

    from dpnotebook.privacy import compute_epsilon

    level = logging.getLogger("absl").level
    with caplog.at_level(logging.WARNING):
        eps = compute_epsilon(noise_multiplier=0.31, sample_rate=0.5, steps=999, delta=1e-5, accountant="rdp")
    assert eps > 100 and not [r for r in caplog.records if r.name == "absl"]
    assert logging.getLogger("absl").level == level  # restored


# -- a tiny sigma: bounded time and memory, still an upper bound ------------------------------------
_CAPPED = """
import resource, sys, warnings
from dpnotebook.privacy import compute_epsilon
# 2 GB above what the imports mapped (a CUDA build of torch maps several GB of address space at import)
mapped = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) << 10
resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30), mapped + (2 << 30)))
{patch}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    eps = compute_epsilon(noise_multiplier={sigma}, sample_rate={q}, steps={steps}, delta=1e-5, accountant="pld")
print(eps)
print(caught[0].message if caught else "")
"""


#: One thread and two malloc arenas in the capped process: the cap is on address space, which thread pools
#: and per-thread arenas reserve per core (64 MB an arena), so that on a 16-core machine it would measure the
#: machine, not the accountant. The one failure of these tests on a GPU machine (16 cores, 2026-11-27)
#: was probably that; its report was not seen.
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}


def _capped_epsilon(sigma: float, q: float, steps: int, patch: str = "") -> tuple[float, str]:
    """compute_epsilon in a subprocess whose address space may grow by at most 2 GB after its imports."""
    import os
    import subprocess
    import sys

    code = _CAPPED.format(sigma=sigma, q=q, steps=steps, patch=patch)
    env = {**os.environ, **_ONE_THREAD}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    eps, message = run.stdout.splitlines()[-2:]
    return float(eps), message


def _optimistic_pld_epsilon(sigma: float, q: float, steps: int, interval: float) -> float:
    """A lower estimate of the true epsilon: dp_accounting's PLD with optimistic rounding."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_gaussian_mechanism(
        sigma, sampling_prob=q, pessimistic_estimate=False, value_discretization_interval=interval
    )
    return one.self_compose(steps).get_epsilon_for_delta(1e-5)


@pytest.mark.slow  # PLD at tiny sigmas: the longest accounting tests
@pytest.mark.parametrize("sigma,q,steps", [(1e-3, 0.5, 10), (1e-3, 0.5, 1000), (0.1, 0.5, 1000)])
def test_pld_with_a_tiny_sigma_fits_in_2gb_and_stays_an_upper_bound(sigma, q, steps):
    eps, message = _capped_epsilon(sigma, q, steps)
    assert "using" in message and "still an upper bound" in message and f"noise_multiplier={sigma}" in message
    interval = float(message.split("using ")[1].split(" ")[0])
    assert eps >= _optimistic_pld_epsilon(sigma, q, steps, interval)


def test_pld_in_typical_settings_keeps_its_interval_and_warns_not(recwarn):
    assert compute_epsilon(noise_multiplier=SIGMA, sample_rate=Q, steps=STEPS, delta=DELTA) == pytest.approx(
        direct(dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3), [(SIGMA, Q, STEPS)]).get_epsilon(
            DELTA
        )
    )
    compute_epsilon(noise_multiplier=0.5, sample_rate=0.01, steps=10_000, delta=DELTA)
    assert not [w for w in recwarn if "PLD accounting" in str(w.message)]


@pytest.mark.slow  # PLD at tiny sigmas: the longest accounting tests
def test_noise_calibration_with_a_large_target_goes_through_small_sigmas():
    sigma = get_noise_multiplier(target_epsilon=2e4, target_delta=1e-5, sample_rate=0.5, steps=10)
    assert compute_epsilon(noise_multiplier=sigma, sample_rate=0.5, steps=10, delta=1e-5) <= 2e4
    assert sigma < 0.1


def _data(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3), torch.randn(n, 1))


LOADERS = {
    "poisson q=0.6": lambda: DPDataLoader(_data(40), sample_rate=0.6, generator=torch.Generator().manual_seed(1)),
    "plain, 93 batches": lambda: DataLoader(_data(93), batch_size=1),
    "plain, 7 batches": lambda: DataLoader(_data(20), batch_size=3),
}


@pytest.mark.parametrize("name", LOADERS)
@pytest.mark.parametrize("target,epochs", [(2.0, 1), (8.0, 1), (3.0, 2)])
def test_training_the_returned_loader_spends_at_most_the_target(name: str, target: float, epochs: int) -> None:
    model = nn.Linear(3, 1)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=LOADERS[name](),
        target_epsilon=target,
        target_delta=1e-3,
        epochs=epochs,
        max_grad_norm=1.0,
    )
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    assert len(engine.accountant) == epochs * len(loader)
    assert engine.get_epsilon(1e-3) <= target


def test_calibration_counts_the_loader_steps() -> None:
    """The reviewer's case: q = 0.6 ran 2 steps per epoch while int(1 / 0.6) = 1 step was calibrated (2.77 > 2)."""
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, epochs=1)
    one_step = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, steps=1)
    two_steps = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.6, steps=2)
    assert sigma == two_steps > one_step
    assert get_noise_multiplier(
        target_epsilon=8.0, target_delta=1e-5, sample_rate=1 / 93, epochs=1, steps_per_epoch=93
    ) == get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=1 / 93, steps=93)


def test_steps_per_epoch_goes_with_epochs_only() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch=5 goes with epochs="):
        get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.1, steps=10, steps_per_epoch=5)
    assert steps_for_epochs(30, 14) == 420


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
