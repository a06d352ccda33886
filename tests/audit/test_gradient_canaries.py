"""White-box gradient canaries: the DP step seen from inside, on real DP-SGD runs.

Without noise the canaries must give themselves away (a large empirical epsilon); with noise the
bound must never pass the accountant's epsilon, and each step's projection must be exactly what the
analysis assumes (1 when sampled, noise of std sigma): a step that skipped its noise, clipped to more
than C or sampled otherwise would fail here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook.audit import GradientCanaries, audited_digits_run, unreached_coordinates
from dpnotebook.privacy._optimizer import DPOptimizer

DELTA = 1e-5
SMALL = dict(members=200, canaries=50, gradient_canaries=1000, delta=DELTA)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_without_noise_the_white_box_audit_sees_a_large_epsilon():
    run = audited_digits_run(noise_multiplier=0.0, epochs=3, seed=0, **SMALL)
    assert run.gradient_audit is not None and run.gradient_canaries is not None
    assert run.gradient_audit.epsilon >= 3
    scores = run.gradient_canaries.scores("sum")
    inc = run.gradient_canaries.included
    # each canary adds exactly C (clipped from 10 C) per step that sampled it, and nothing else reaches it
    assert np.allclose(scores[inc], np.round(scores[inc]), atol=1e-4)
    assert (scores[~inc] == 0).all()
    assert 0.5 * run.steps * run.sample_rate < scores[inc].mean() < 1.5 * run.steps * run.sample_rate


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_never_exceeds_the_accountants_epsilon(seed):
    run = audited_digits_run(target_epsilon=2.0, epochs=5, seed=seed, **SMALL)
    assert run.gradient_audit is not None
    assert run.gradient_audit.epsilon <= run.epsilon
    assert run.gradient_audit_of("steps").epsilon <= run.epsilon


def test_each_steps_projection_is_what_the_analysis_assumes():
    run = audited_digits_run(noise_multiplier=1.5, epochs=5, seed=1, **SMALL)
    c = run.gradient_canaries
    assert c is not None
    z = np.stack(c.projections)  # [steps, m], units of C
    assert z.shape == (run.steps, 1000)
    out = z[:, ~c.included]
    assert abs(out.mean()) < 0.02 and abs(out.std() / run.noise_multiplier - 1) < 0.02  # N(0, sigma^2) exactly
    signal = z[:, c.included].mean()  # q (sampled) on top of the same noise
    assert abs(signal - run.sample_rate) < 4 * run.noise_multiplier / np.sqrt(z[:, c.included].size)


def test_random_direction_canaries_are_clipped_like_a_sample():
    model = dpnotebook.wrap_model(nn.Linear(400, 1), "hooks")
    canaries = GradientCanaries.random(model._module.weight, np.array([True, True]), seed=0)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=2.0, expected_batch_size=2
    )
    canaries.attach(opt)
    model(torch.zeros(2, 400)).sum().backward()  # the ordinary row's weight gradient is 0
    canaries.inject(torch.tensor([0, -1]))
    opt.step()
    scores = canaries.scores("sum")
    assert scores[0] == pytest.approx(1.0, abs=1e-5)  # norm 10 clipped to C, read back in units of C
    assert abs(scores[1]) < 0.2  # another random direction: nearly orthogonal, not 1


def test_canaries_are_written_into_every_backward_pass_of_a_list_grad_sample():
    """Two backward passes before one step (``p.grad_sample`` a list): ids number the rows of all passes in order."""
    model = dpnotebook.wrap_model(nn.Linear(4, 2), "hooks")
    weight, bias = model._module.weight, model._module.bias
    canaries = GradientCanaries.dirac(weight, [0, 5], np.array([True, True]), gradient_norm=3.0)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=2.0, expected_batch_size=5
    )
    canaries.attach(opt)
    x = torch.tensor([0.0, 0.0, 1.0, 1.0])  # the ordinary rows reach neither canary coordinate (w[0, 0], w[1, 1])
    model(x.repeat(2, 1)).sum().backward()
    model(x.repeat(3, 1)).sum().backward()
    canaries.inject(torch.tensor([1, -1, -1, -1, 0]))  # canary 1: row 0 (first pass); canary 0: row 4 (second)
    first, second = weight.grad_sample
    assert first[0].flatten().tolist() == [0, 0, 0, 0, 0, 3.0, 0, 0]
    assert second[2].flatten().tolist() == [3.0, 0, 0, 0, 0, 0, 0, 0]
    assert bias.grad_sample[0][0].abs().sum() == 0 and bias.grad_sample[1][2].abs().sum() == 0
    assert first[1].abs().sum() > 0 and second[0].abs().sum() > 0  # ordinary rows untouched
    opt.step()
    assert canaries.scores("sum").tolist() == pytest.approx([1.0, 1.0], abs=1e-5)  # each clipped to C once


def test_audited_digits_run_trains_on_the_device_it_is_given(device):
    """Issue #31: the run trains on ``device`` (the session's: the GPU under ``pytest --device cuda``)."""
    tiny = dict(noise_multiplier=1.0, members=60, canaries=20, gradient_canaries=10, epochs=2, batch_size=32)
    seen = []
    real = nn.Linear.forward
    try:
        nn.Linear.forward = lambda self, x: (seen.append(x.device.type), real(self, x))[1]
        run = audited_digits_run(device=device, **tiny)
    finally:
        nn.Linear.forward = real
    assert seen and device.type in seen  # the training steps ran there
    assert all(p.device.type == "cpu" for p in run.model.parameters())  # handed back for the attacks
    assert run.steps > 0 and math.isfinite(run.epsilon)
    if device.type == "cpu":  # the device argument changes nothing else: the default run's numbers exactly
        default = audited_digits_run(**tiny)
        assert np.array_equal(run.canary_scores, default.canary_scores) and run.epsilon == default.epsilon
        assert np.array_equal(run.gradient_canaries.scores("sum"), default.gradient_canaries.scores("sum"))


def test_audited_digits_run_refuses_a_device_before_training():
    with pytest.raises(ValueError, match=r"device='gpu' is not a device.*default_device\(\)"):
        audited_digits_run(noise_multiplier=1.0, members=50, canaries=10, epochs=1, device="gpu")


def test_unreached_coordinates_are_those_of_blank_inputs():
    x = torch.tensor([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    assert unreached_coordinates(torch.zeros(2, 3), x).tolist() == [0, 2, 3, 5]
    with pytest.raises(ValueError, match="values per record"):
        unreached_coordinates(torch.zeros(2, 4), x)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="without DP-SGD"):
        audited_digits_run(members=50, canaries=10, gradient_canaries=10, epochs=1)
    with pytest.raises(ValueError, match="only .* first-layer weights"):
        audited_digits_run(noise_multiplier=1.0, members=50, canaries=10, gradient_canaries=5000, epochs=1)
    w = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="one coin per canary"):
        GradientCanaries.dirac(w, [0, 1], np.array([True]))
    with pytest.raises(ValueError, match="flat indices in"):
        GradientCanaries.dirac(w, [0, 4], np.array([True, False]))
    with pytest.raises(ValueError, match="gradient_norm"):
        GradientCanaries.dirac(w, [0], np.array([True]), gradient_norm=0.0)
    model = dpnotebook.wrap_model(nn.Linear(2, 1), "hooks")
    c = GradientCanaries.dirac(model._module.weight, [0, 1], np.array([True, False]))
    with pytest.raises(TypeError, match="DPOptimizer"):
        c.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="after backward"):
        c.inject(torch.tensor([0]))
    model(torch.ones(2, 2)).sum().backward()
    with pytest.raises(ValueError, match="left out by its coin"):
        c.inject(torch.tensor([-1, 1]))
    with pytest.raises(RuntimeError, match="no step recorded"):
        c.scores()
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=2
    )
    c.attach(opt, sample_rate=0.5)
    c.inject(torch.tensor([-1, 0]))
    opt.step()
    with pytest.raises(ValueError, match="needs noise"):
        c.scores("steps")
    with pytest.raises(ValueError, match="kind="):
        c.scores("max")


def test_the_gradient_canaries_coordinates_do_not_depend_on_the_input_canaries_coins(monkeypatch):
    # the audit is sound only if nothing but the DP training sees the coins: where the gradient
    # canaries go may depend on the members and on every canary, never on which canaries are in
    from dpnotebook.audit import _attacks

    real = _attacks.draw_inclusion
    coordinates = []
    for coin in (False, True):
        fake = lambda n, *, seed, coin=coin: np.full(n, coin) if n == 8 else real(n, seed=seed)  # noqa: E731
        monkeypatch.setattr(_attacks, "draw_inclusion", fake)
        run = audited_digits_run(noise_multiplier=1.0, members=10, canaries=8, gradient_canaries=4, epochs=1)
        assert run.gradient_canaries is not None and run.included.all() == coin
        coordinates.append(run.gradient_canaries.coordinates)
    assert torch.equal(*coordinates)
