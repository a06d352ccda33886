"""PrivacyAttackExplorer: the point is on the Gaussian trade-off curve, under its bound; real attacks follow."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dpnotebook.audit import AuditedRun, attack_roc, dp_tpr_bound, gaussian_epsilon, gaussian_tpr
from dpnotebook.widgets import PrivacyAttackExplorer, WidgetValueError
from dpnotebook.widgets.attack import Attack, attacks_from_runs, plots, simulated_attacks
from dpnotebook.widgets.attack.state import FPR_GRID


@pytest.fixture
def explorer():
    return PrivacyAttackExplorer(backend="static")


def test_threshold_moves_the_point_along_the_curve(explorer, fignums):
    ex = explorer
    for t in (-1.0, 0.0, 0.5, 1.3, 3.0):
        ex.controls["threshold"].value = t
        fpr, tpr = ex.tradeoff.point.get_xydata()[0]
        sigma = ex.state.noise_multiplier
        assert fpr == pytest.approx(norm.sf(t / sigma)) and tpr == pytest.approx(norm.sf((t - 1) / sigma))
        assert tpr == pytest.approx(float(gaussian_tpr(fpr, 1 / sigma)), abs=1e-9)  # on the curve
        assert tpr <= float(dp_tpr_bound(fpr, gaussian_epsilon(1 / sigma, ex.state.delta), ex.state.delta)) + 1e-12
        assert ex.densities.threshold.get_xdata()[0] == t


def test_best_threshold_is_halfway(explorer):
    ex = explorer
    advantages = {}
    for t in np.linspace(-1, 2, 31):
        ex.state.threshold = float(t)
        advantages[round(float(t), 2)] = ex.state.view().advantage
    assert max(advantages, key=advantages.get) == 0.5
    assert advantages[0.5] == pytest.approx(2 * norm.cdf(0.5 / ex.state.noise_multiplier) - 1)


def test_sigma_and_delta_change_the_bound(explorer):
    ex = explorer
    ex.controls["noise_multiplier"].value = 2.0
    eps = gaussian_epsilon(0.5, 1e-5)
    np.testing.assert_allclose(ex.tradeoff.bound.get_ydata(), dp_tpr_bound(FPR_GRID, eps, 1e-5))
    np.testing.assert_allclose(ex.tradeoff.curve.get_ydata(), gaussian_tpr(FPR_GRID, 0.5))
    assert "epsilon = " + f"{eps:.3g}" in ex.label.get_text()
    # the label states both inequalities the dashed bound draws (dp_tpr_bound's minimum of two lines)
    assert "TPR <= e^eps FPR + delta" in ex.label.get_text()
    assert "1 - TPR >= e^-eps (1 - FPR - delta)" in ex.label.get_text()
    ex.controls["delta"].value = 1e-3
    assert ex.state.view().epsilon < eps


def test_selected_attack_is_highlighted_with_its_bound(explorer):
    ex = explorer
    ex.controls["selected"].value = "sigma = 2"
    line = ex.rocs.lines["sigma = 2"]
    assert line.get_linewidth() > ex.rocs.lines["sigma = 1"].get_linewidth()
    attack = ex.state.attacks["sigma = 2"]
    np.testing.assert_allclose(
        ex.rocs.bound.get_ydata(), np.maximum(dp_tpr_bound(FPR_GRID, attack.epsilon, attack.delta), 1e-3)
    )
    np.testing.assert_allclose(ex.rocs.curve.get_ydata(), np.maximum(gaussian_tpr(FPR_GRID, 0.5), 1e-3))
    assert "sigma = 2" in ex.roc_title.get_text()


def test_simulated_attacks_follow_the_gaussian_curve():
    for sigma, attack in zip((0.5, 1.0, 2.0), simulated_attacks(canaries=4000).values(), strict=True):
        assert attack.roc.auc == pytest.approx(
            norm.cdf(1 / sigma / math.sqrt(2)), abs=0.03
        )  # AUC of N(mu, 1) vs N(0, 1)
        assert attack.epsilon == pytest.approx(gaussian_epsilon(1 / sigma, 1e-5))


def test_runs_become_attacks_with_their_pld_curve():
    roc = attack_roc([1.0, 2.0], [0.0, 0.5])
    common = dict(
        model=None,
        delta=1e-5,
        train_accuracy=1.0,
        test_accuracy=1.0,
        attack=roc,
        one_run=None,
        included=np.array([True, False, True]),
        canary_scores=np.array([0.0, -1.0, -0.5]),
    )
    runs = {
        "eps 8": AuditedRun(epsilon=8.0, noise_multiplier=1.0, sample_rate=0.1, steps=50, **common),
        "no DP": AuditedRun(epsilon=math.inf, noise_multiplier=math.nan, **common),
    }
    attacks = attacks_from_runs(runs)
    assert attacks["no DP"].roc.member_scores.tolist() == [0.0, -0.5]  # the canaries trained on
    assert attacks_from_runs(runs, records="digits")["no DP"].roc is roc
    with pytest.raises(WidgetValueError, match="records='all' is invalid"):
        attacks_from_runs(runs, records="all")
    assert attacks["no DP"].curve is None and attacks["eps 8"].curve.shape == FPR_GRID.shape
    ex = PrivacyAttackExplorer(attacks=attacks, backend="static")
    assert ex.state.selected == "eps 8"
    ex.state.selected = "no DP"
    assert (ex.rocs.bound.get_ydata() == 1).all()  # not private: no bound below 1
    assert np.isnan(ex.rocs.curve.get_ydata()).all()


def test_without_attacks_there_is_no_dropdown():
    ex = PrivacyAttackExplorer(attacks={}, backend="static")
    assert "selected" not in ex.controls and ex.state.selected == ""
    assert "none given" in ex.roc_title.get_text()


@pytest.mark.parametrize(
    "name, value, text",
    [
        ("noise_multiplier", 0.0, "noise_multiplier=0.0 is invalid"),
        ("noise_multiplier", -1.0, "noise_multiplier=-1.0 is invalid"),
        ("noise_multiplier", 0.01, "noise_multiplier=0.01 is invalid: use 0.05 <= sigma"),  # FPR 0 by underflow
        ("noise_multiplier", 101.0, "noise_multiplier=101.0 is invalid: use 0.05 <= sigma <= 100"),
        ("threshold", math.inf, "threshold=inf is invalid"),
        ("delta", 1.0, "delta=1.0 is invalid"),
        ("selected", "nope", "selected='nope' is invalid"),
    ],
)
def test_bad_values_refused(explorer, name, value, text):
    with pytest.raises(WidgetValueError, match=text):
        setattr(explorer.state, name, value)


def test_attacks_must_be_attack_objects():
    with pytest.raises(TypeError, match=r"attacks\['x'\] is a dict"):
        PrivacyAttackExplorer(attacks={"x": {}}, backend="static")
    assert isinstance(simulated_attacks((1.0,), canaries=10)["sigma = 1"], Attack)


def test_callback_error_is_displayed(explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_tradeoff", boom)
    explorer.controls["threshold"].value = 1.0
    assert "boom from a plot update" in explorer.error.message
