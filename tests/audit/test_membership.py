"""ROC, advantage and the membership attacks, against hand counts and the DP bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from dpnotebook.audit import (
    advantage_bound,
    attack_roc,
    calibrated_attack,
    dp_tpr_bound,
    example_losses,
    gaussian_epsilon,
    gaussian_tpr,
    loss_threshold_attack,
)


def test_roc_by_hand():
    roc = attack_roc([0.9, 0.8, 0.1], [0.7, 0.2, 0.05, 0.0])
    # thresholds inf, .9, .8, .7, .2, .1, .05, 0
    assert roc.tpr.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 2 / 3, 2 / 3, 1, 1, 1])
    assert roc.fpr.tolist() == pytest.approx([0, 0, 0, 1 / 4, 2 / 4, 2 / 4, 3 / 4, 1])
    assert roc.advantage == pytest.approx(2 / 3)
    assert roc.best_threshold == 0.8
    # AUC = P(member score > non-member score): 10 of 12 pairs
    assert roc.auc == pytest.approx(10 / 12)
    assert roc.tpr_at(0.25) == pytest.approx(2 / 3)


def test_gaussian_scores_roc_follows_the_tradeoff_curve():
    rng = np.random.default_rng(0)
    mu = 1.0
    roc = attack_roc(rng.standard_normal(20000) + mu, rng.standard_normal(20000))
    assert roc.auc == pytest.approx(norm.cdf(mu / np.sqrt(2)), abs=0.01)
    np.testing.assert_allclose(roc.tpr, gaussian_tpr(roc.fpr, mu), atol=0.02)
    assert roc.advantage == pytest.approx(2 * norm.cdf(mu / 2) - 1, abs=0.02)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_advantage_of_the_gaussian_mechanism_within_its_bound(mu):
    eps = gaussian_epsilon(mu, 1e-5)
    best = 2 * norm.cdf(mu / 2) - 1  # the Gaussian's exact best advantage
    assert best <= advantage_bound(eps, 1e-5)
    grid = np.linspace(0, 1, 10001)
    assert (dp_tpr_bound(grid, eps, 1e-5) - grid).max() == pytest.approx(advantage_bound(eps, 1e-5), abs=1e-3)


def test_roc_bad_input():
    with pytest.raises(ValueError, match="member_scores has 0 scores"):
        attack_roc([], [1.0])
    with pytest.raises(ValueError, match="nonmember_scores has 1 scores with NaN"):
        attack_roc([1.0], [float("nan")])
    with pytest.raises(ValueError, match="fpr=2 is invalid"):
        attack_roc([1.0], [0.0]).tpr_at(2)


def _overfit(x, y, steps=300):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.Tanh(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


@pytest.mark.slow  # trains and attacks several models
def test_loss_attack_finds_members_of_a_memorising_model():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(80, 10, generator=g), torch.randint(0, 2, (80,), generator=g)  # random labels
    model = _overfit(x[:40], y[:40])
    roc = loss_threshold_attack(model, (x[:40], y[:40]), (x[40:], y[40:]))
    assert roc.auc > 0.9 and roc.advantage > 0.6
    assert roc.member_scores.tolist() == pytest.approx((-example_losses(model, x[:40], y[:40])).tolist())
    assert model.training  # example_losses restored train mode


@pytest.mark.slow  # trains and attacks several models
def test_calibrated_attack_subtracts_the_reference_loss():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(60, 10, generator=g), torch.randint(0, 2, (60,), generator=g)
    target, reference = _overfit(x[:20], y[:20]), _overfit(x[40:], y[40:])
    roc = calibrated_attack(target, [reference], (x[:20], y[:20]), (x[20:40], y[20:40]))
    want = example_losses(reference, x[:20], y[:20]) - example_losses(target, x[:20], y[:20])
    np.testing.assert_allclose(roc.member_scores, want.numpy())
    assert roc.auc > 0.6  # members still found
    with pytest.raises(ValueError, match="reference_models is empty"):
        calibrated_attack(target, [], (x, y), (x, y))


def test_example_losses_needs_one_loss_per_record():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="one loss per record"):
        example_losses(model, torch.randn(4, 3), torch.zeros(4, dtype=torch.long), loss_fn=nn.functional.cross_entropy)
    with pytest.raises(ValueError, match="inputs has 4 records but targets has 3"):
        example_losses(model, torch.randn(4, 3), torch.zeros(3, dtype=torch.long))


def test_audited_run_calibrated_canary_attack_is_calibrated_attack_on_its_canaries():
    import warnings

    from dpnotebook.audit import audited_digits_run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = audited_digits_run(members=64, canaries=40, epochs=2, seed=0)
            reference = audited_digits_run(members=64, canaries=40, epochs=2, seed=1).model
    finally:
        torch.set_num_threads(threads)
    x, y = run.canaries
    keep = torch.from_numpy(run.included)
    want = calibrated_attack(run.model, [reference], (x[keep], y[keep]), (x[~keep], y[~keep]))
    got = run.calibrated_canary_attack([reference])
    np.testing.assert_allclose(got.member_scores, want.member_scores)
    np.testing.assert_allclose(run.canary_attack.member_scores, -example_losses(run.model, x[keep], y[keep]).numpy())


def test_sliced_attack_gives_each_group_its_own_roc():
    from dpnotebook.audit import attack_roc, sliced_attack

    rng = np.random.default_rng(0)
    members, others = rng.standard_normal(300), rng.standard_normal(300)
    mg, ng = np.arange(300) % 3, np.arange(300) % 3
    members[mg == 2] += 3.0  # only group 2 leaks
    sliced = sliced_attack(attack_roc(members, others), mg, ng)
    assert sorted(sliced) == [0, 1, 2]
    assert sliced[2].auc > 0.95 and sliced[0].auc < 0.65
    np.testing.assert_array_equal(sliced[1].member_scores, members[mg == 1])
    with pytest.raises(ValueError, match="one group per scored record"):
        sliced_attack(attack_roc(members, others), mg[:10], ng)
    with pytest.raises(ValueError, match="no group has both"):
        sliced_attack(attack_roc(members, others), np.zeros(300), np.ones(300))


@pytest.mark.parametrize("seed", range(5))
def test_our_roc_equals_scikit_learns_ties_included(seed: int) -> None:
    """attack_roc stays ours (scikit-learn is a lab extra, the auditor needs core deps only), and agrees with it."""
    from sklearn.metrics import roc_auc_score, roc_curve

    rng = np.random.default_rng(seed)
    members = rng.integers(0, 12, size=40 + seed).astype(float)  # few distinct values: many ties
    others = rng.integers(0, 10, size=30).astype(float) + rng.choice([0.0, 0.5], size=30)
    roc = attack_roc(members, others)
    labels = np.r_[np.ones(members.size), np.zeros(others.size)]
    scores = np.r_[members, others]
    fpr, tpr, thresholds = roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(roc.fpr, fpr)
    np.testing.assert_allclose(roc.tpr, tpr)
    np.testing.assert_array_equal(roc.thresholds[1:], thresholds[1:])
    assert roc.auc == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


@pytest.mark.slow  # a fresh interpreter
def test_the_auditor_imports_without_the_lab_extra() -> None:
    """What justifies attack_roc's own ROC: dpnotebook.audit runs with scikit-learn, matplotlib, ipywidgets absent."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('sklearn', 'matplotlib', 'ipywidgets'): sys.modules[m] = None\n"
        "import dpnotebook.audit\n"
        "from dpnotebook.audit import attack_roc\n"
        "print(attack_roc([1.0, 2.0], [0.0, 1.0]).auc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "0.875", done.stderr[-2000:]
