"""TrainingMonitor: a callback in a plain (DP) training loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import PrivacyEngine
from dpnotebook.widgets import TrainingMonitor, WidgetValueError, make_blobs
from dpnotebook.widgets.monitor import plots


def test_update_draws_each_metric(fignums):
    m = TrainingMonitor(total_steps=5, redraw_every=0, progress=False, backend="static", target_epsilon=1.0)
    for step in range(1, 6):
        m.update(step=step, loss=2.0 / step, accuracy=0.1 * step, epsilon=0.2 * step, clip_fraction=0.5)
    assert m.plots["loss"].line.get_ydata()[-1] == pytest.approx(0.4)
    assert m.plots["epsilon"].last.get_xdata().tolist() == [5.0]
    assert m.plots["epsilon"].target.get_ydata()[0] == 1.0
    assert m.plots["epsilon"].ax.get_ylim()[1] > 1.0
    m.close()


def test_steps_default_and_partial_metrics():
    m = TrainingMonitor(redraw_every=0, progress=False, backend="static")
    m(loss=1.0)
    m(loss=0.5, epsilon=0.1)
    assert m.state.series("loss") == ([1, 2], [1.0, 0.5])
    assert m.state.series("epsilon") == ([2], [0.1])


def test_redraw_is_throttled():
    m = TrainingMonitor(redraw_every=3600, progress=False, backend="static")
    m.update(loss=1.0)  # the first update draws
    m.update(loss=0.5)
    assert m.plots["loss"].line.get_ydata().tolist() == [1.0]
    m.close()  # close always draws
    assert m.plots["loss"].line.get_ydata().tolist() == [1.0, 0.5]


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(accuracy=1.5), "accuracy=1.5 is invalid"),
        (dict(clip_fraction=-0.1), "clip_fraction=-0.1 is invalid"),
        (dict(loss=float("nan")), "loss=nan is invalid"),
        (dict(epsilon=-1.0), "epsilon=-1.0 is invalid"),
        (dict(step=0, loss=1.0), "step=0 is invalid: steps must not go back"),
    ],
)
def test_bad_values_refused(kwargs, text):
    m = TrainingMonitor(redraw_every=0, progress=False, backend="static")
    m.update(step=1, loss=2.0)
    with pytest.raises(WidgetValueError, match=text):
        m.update(**kwargs)
    assert m.state.series("loss") == ([1], [2.0])


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(total_steps=0), "total_steps=0 is invalid"),
        (dict(redraw_every=-1), "redraw_every=-1.0 is invalid"),
        (dict(target_epsilon=0.0), "target_epsilon=0.0 is invalid"),
    ],
)
def test_bad_settings_refused(kwargs, text):
    with pytest.raises(WidgetValueError, match=text):
        TrainingMonitor(progress=False, backend="static", **kwargs)


def test_a_run_without_noise_shows_epsilon_inf(fignums):
    # before: log_step with a sigma = 0 engine raised "epsilon=inf is invalid: it must be a number >= 0"
    m = TrainingMonitor(total_steps=3, redraw_every=0, backend="static", target_epsilon=1.0)
    m.update(loss=1.0, epsilon=0.5)
    m.update(loss=0.9, epsilon=float("inf"))  # what get_epsilon returns for sigma = 0: not private
    assert m.state.last("epsilon") == float("inf") and m.progress.postfix == "loss=0.9, epsilon=inf"
    assert m.error.message == "" and m.plots["epsilon"].ax.get_ylim()[1] > 1.0
    m.close()


def test_progress_bar_advances():
    m = TrainingMonitor(total_steps=10, redraw_every=0, backend="static")
    m.update(step=3, loss=1.0)
    m.update(step=4, loss=0.9)
    assert m.progress.n == 4
    m.close()


def test_draw_error_is_displayed_not_raised(monkeypatch, boom):
    m = TrainingMonitor(redraw_every=0, progress=False, backend="static")
    monkeypatch.setattr(plots, "update_metric", boom)
    m.update(loss=1.0)  # training goes on
    assert "boom from a plot update" in m.error.message


def test_with_a_real_dp_training_loop(fignums):
    x, y = make_blobs(64, seed=0)
    model = nn.Linear(2, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(TensorDataset(x, y.long()), batch_size=16),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(0),
        sampling_generator=torch.Generator().manual_seed(1),
    )
    with TrainingMonitor(total_steps=len(loader), redraw_every=0, backend="static") as monitor:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), targets) if len(targets) else torch.tensor(0.0)
            if len(targets):
                loss.backward()
            optimizer.step()
            monitor.log_step(loss.item(), optimizer=optimizer, privacy_engine=engine, delta=1e-3)
    eps = monitor.state.series("epsilon")[1]
    assert len(eps) == len(loader) and eps == sorted(eps) and eps[-1] > 0
    assert monitor.state.last("clip_fraction") == optimizer.last_step_stats.fraction_clipped


def test_the_epsilon_curve_ends_at_the_last_step(fignums):
    """Between redraws log_step skips epsilon (slow); close() records the last step's, so the curve ends there."""

    class Engine:
        steps = 0

        def get_epsilon(self, delta: float) -> float:
            return 0.5 * self.steps

    engine = Engine()
    monitor = TrainingMonitor(total_steps=6, redraw_every=1e9, progress=False, backend="static")
    for _ in range(6):
        engine.steps += 1
        monitor.log_step(1.0, privacy_engine=engine)
    assert monitor.state.series("epsilon") == ([1], [0.5])  # before: the run's figure stopped here
    monitor.close()
    assert monitor.state.series("epsilon") == ([1, 6], [0.5, 3.0])
    monitor.close()  # nothing owed any more: no second point
    assert monitor.state.series("epsilon") == ([1, 6], [0.5, 3.0])
