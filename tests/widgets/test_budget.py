"""PrivacyBudgetExplorer: epsilon follows sigma, the required sigma meets the target, slow work waits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dpnotebook.privacy import compute_epsilon
from dpnotebook.widgets import PrivacyBudgetExplorer, WidgetValueError
from dpnotebook.widgets.budget import plots

SETTINGS = dict(batch_size=100, dataset_size=10_000, epochs=4, accountant="rdp", points=4, target_epsilon=2.0)


@pytest.fixture
def explorer():
    return PrivacyBudgetExplorer(backend="static", **SETTINGS)


def test_epsilon_curve_follows_sigma(explorer, fignums):
    ex = explorer
    before = ex.curves.current.get_ydata().copy()
    ex.controls["noise_multiplier"].value = 2.0
    after = ex.curves.current.get_ydata()
    assert (after < before).all()
    assert after[-1] == pytest.approx(
        compute_epsilon(noise_multiplier=2.0, sample_rate=0.01, steps=400, delta=1e-5, accountant="rdp")
    )
    assert "epsilon = " in ex.label.get_text()


def test_required_sigma_meets_target(explorer):
    r = explorer.state.compute()
    assert r.required_epsilons[-1] <= 2.0
    assert r.required_epsilons[-1] == pytest.approx(2.0, abs=0.02)
    assert f"{r.required_sigma:.3g}" in explorer.label.get_text()
    np.testing.assert_allclose(explorer.curves.required.get_ydata(), r.required_epsilons)


def test_epochs_extend_the_curve(explorer):
    explorer.controls["epochs"].value = 8
    assert explorer.curves.current.get_xdata()[-1] == 8


def test_cache_makes_revisits_free(explorer):
    s = explorer.state
    key = s.key()
    explorer.state.noise_multiplier = 1.5
    explorer.state.noise_multiplier = 1.0
    assert s.key() == key and s.cached() is not None


def test_debounce_in_a_running_loop():
    async def main():
        ex = PrivacyBudgetExplorer(backend="static", debounce=0.05, **SETTINGS)
        old = ex.curves.current.get_ydata().copy()
        ex.state.noise_multiplier = 1.7
        ex.state.noise_multiplier = 1.8  # replaces the pending computation
        assert ex.pending
        assert ex.label.get_text() == "computing epsilon ..."
        np.testing.assert_allclose(ex.curves.current.get_ydata(), old)  # old curve, greyed
        assert ex.curves.current.get_alpha() == 0.3
        await asyncio.sleep(0.3)
        assert not ex.pending
        assert ex.curves.current.get_alpha() == 1.0
        assert ex.state.cached() is not None
        assert ex.state._results.get((1.7,) + ex.state.key()[1:]) is None  # skipped
        return ex

    asyncio.run(main())


@pytest.mark.parametrize(
    "name, value, text",
    [
        ("delta", 1.0, "delta=1.0 is invalid"),
        ("delta", 0.0, "delta=0.0 is invalid"),
        ("noise_multiplier", 0.0, "noise_multiplier=0.0 is invalid"),
        ("batch_size", 20_000, "batch_size=20000 is invalid: it must be <= dataset_size=10000"),
        ("dataset_size", 10, "dataset_size=10 is invalid: it must be >= batch_size=100"),
        ("epochs", 0, "epochs=0 is invalid"),
        ("accountant", "moments", "accountant='moments' is unknown"),
        ("target_epsilon", -1.0, "target_epsilon=-1.0 is invalid"),
    ],
)
def test_bad_values_refused(explorer, name, value, text):
    with pytest.raises(WidgetValueError, match=text):
        setattr(explorer.state, name, value)


def test_bad_text_entry_is_shown_and_undone(explorer):
    explorer.controls["delta"].value = 1.5
    assert explorer.state.delta == 1e-5 and explorer.controls["delta"].value == 1e-5
    assert explorer.error.message.startswith("WidgetValueError: delta=1.5 is invalid")


def test_set_checks_values_together(explorer):
    with pytest.raises(WidgetValueError, match="dataset_size=80 is invalid"):
        explorer.set(dataset_size=80)  # alone: smaller than the batch of 100
    assert explorer.state.dataset_size == 10_000  # nothing changed
    explorer.set(dataset_size=80, batch_size=8)  # together: fine
    assert explorer.state.sample_rate == pytest.approx(0.1)


def test_large_delta_warning_shown(explorer):
    explorer.state.delta = 1e-3
    assert "delta=0.001 is >= 1/N" in explorer.status.value


def test_unreachable_target_is_reported(explorer, monkeypatch):
    import dpnotebook.widgets.budget.state as state_module

    def refuse(**kwargs):
        raise ValueError("target_epsilon=0.5 cannot be reached with noise_multiplier <= 1e6.")

    monkeypatch.setattr(state_module, "get_noise_multiplier", refuse)
    explorer.state.target_epsilon = 0.5
    assert "sigma needed: target_epsilon=0.5 cannot be reached" in explorer.label.get_text()
    assert np.isnan(explorer.curves.required.get_ydata()).all()
    assert explorer.error.message == ""


def test_callback_error_is_displayed(explorer, monkeypatch, boom):
    monkeypatch.setattr(plots, "update_epsilon_curves", boom)
    explorer.controls["epochs"].value = 5
    assert "boom from a plot update" in explorer.error.message


def test_the_explorer_defaults_to_the_engines_accountant(fignums):
    """What the explorer shows by default is what PrivacyEngine() reports: both use PLD."""
    import inspect

    from dpnotebook.privacy import PrivacyEngine
    from dpnotebook.widgets.budget.state import BudgetState

    engine_default = inspect.signature(PrivacyEngine).parameters["accountant"].default
    assert PrivacyEngine().accountant.mechanism == engine_default == "pld"
    assert inspect.signature(PrivacyBudgetExplorer).parameters["accountant"].default == engine_default
    assert BudgetState().accountant == engine_default
    ex = PrivacyBudgetExplorer(backend="static", batch_size=100, dataset_size=10_000, epochs=2, points=2)
    assert ex.state.accountant == "pld" and "(pld)" in ex.label.get_text()
