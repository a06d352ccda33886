"""Item 5: the ``DPOptimizer`` contract Opacus code relies on: a subclass overriding ``add_noise`` (reading
``p.summed_grad``, writing ``p.grad``), ``grad_samples``, ``pre_step``, ``signal_skip_step`` and the accountant's
``get_optimizer_hook_fn``, run with both libraries on the same data."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, flat_params, lib, loader, mlp


def custom_noise_script(name: str) -> tuple[nn.Module, list, float]:
    """A user's optimizer with its own (here deterministic) noise, built by hand as Opacus' examples do."""
    base = lib(name, "optimizers").DPOptimizer

    class ShiftedNoise(base):
        def add_noise(self):
            for p in self.params:
                p.grad = (p.summed_grad + 0.01).view_as(p)

    model = lib(name, "grad_sample").GradSampleModule(mlp())
    optimizer = ShiftedNoise(
        torch.optim.SGD(model.parameters(), lr=0.5), noise_multiplier=1.0, max_grad_norm=0.3, expected_batch_size=16
    )
    accountant = lib(name, "accountants").RDPAccountant()
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=0.25))
    shapes = []
    for x, y in loader(dataset()):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        shapes.append([tuple(g.shape) for g in optimizer.grad_samples])
        optimizer.step()
    return model._module, shapes, accountant.get_epsilon(1e-5)


def test_custom_add_noise_matches_opacus() -> None:
    runs = {name: custom_noise_script(name) for name in LIBRARIES}
    (m_o, s_o, e_o), (m_d, s_d, e_d) = runs["opacus"], runs["dpnotebook"]
    assert s_d == s_o == [[(16, 8, 5), (16, 8), (16, 3, 8), (16, 3)]] * 4
    torch.testing.assert_close(flat_params(m_d), flat_params(m_o), rtol=1e-4, atol=1e-5)
    assert e_d == pytest.approx(e_o, rel=0.01)


def test_pre_step_and_signal_skip_step() -> None:
    for name in LIBRARIES:
        model = lib(name, "grad_sample").GradSampleModule(mlp())
        optimizer = lib(name, "optimizers").DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.5),
            noise_multiplier=0.0,
            max_grad_norm=1.0,
            expected_batch_size=8,
        )
        x, y = dataset()[:8]
        before = flat_params(model)
        optimizer.signal_skip_step(True)
        nn.functional.cross_entropy(model(x[:4]), y[:4]).backward()
        optimizer.step()  # skipped: clipped and kept for the logical batch
        optimizer.zero_grad()
        assert torch.equal(flat_params(model), before), name
        nn.functional.cross_entropy(model(x[4:]), y[4:]).backward()
        assert optimizer.pre_step() is True, name


def engine_optimizer_script(name: str, mode: str) -> tuple[list, int, bool]:
    """Opacus code that reads the optimizer make_private returns: grad_samples, accumulated_iterations, pre_step."""
    model = mlp()
    engine = lib(name, "privacy_engine").PrivacyEngine()
    model, optimizer, data_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        grad_sample_mode=mode,
        poisson_sampling=False,
    )
    x, y = next(iter(data_loader))
    nn.functional.cross_entropy(model(x), y).backward()
    shapes = [tuple(g.shape) for g in optimizer.grad_samples]
    iterations = optimizer.accumulated_iterations
    optimizer.signal_skip_step(True)
    return shapes, iterations, optimizer.pre_step()


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_the_optimizer_make_private_returns_has_the_contract(mode: str) -> None:
    runs = {name: engine_optimizer_script(name, mode) for name in LIBRARIES}
    assert runs["dpnotebook"][0] == runs["opacus"][0] and runs["dpnotebook"][0]  # same grad_sample shapes
    assert runs["dpnotebook"][1:] == runs["opacus"][1:] == (1, False)  # one batch, and a step skipped as asked


def _kept_state(name: str) -> dict:
    """Opacus' optimizer state around a step (issue #33.10): clip_and_accumulate, summed_grad, grad_sample."""
    model = mlp()
    engine = lib(name, "privacy_engine").PrivacyEngine()
    model, optimizer, data_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=0.0,
        max_grad_norm=0.5,
        poisson_sampling=False,
    )
    x, y = next(iter(data_loader))
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.clip_and_accumulate()
    state = {"after_clip": [p.summed_grad.clone() for p in optimizer.params]}
    optimizer.zero_grad()  # a skipped step's sum survives zero_grad in Opacus only after signal_skip_step
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    state["summed_after_step"] = [p.summed_grad.clone() for p in optimizer.params]
    state["grad_sample_after_step"] = [tuple(p.grad_sample.shape) for p in optimizer.params]
    optimizer.zero_grad()
    state["cleared"] = all(p.grad_sample is None and p.summed_grad is None for p in optimizer.params)
    return state


def test_clip_and_accumulate_summed_grad_and_grad_sample_until_zero_grad_as_in_opacus() -> None:
    runs = {name: _kept_state(name) for name in LIBRARIES}
    o, d = runs["opacus"], runs["dpnotebook"]
    for key in ("after_clip", "summed_after_step"):
        for a, b in zip(d[key], o[key], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert d["grad_sample_after_step"] == o["grad_sample_after_step"] == [(16, 8, 5), (16, 8), (16, 3, 8), (16, 3)]
    assert d["cleared"] and o["cleared"]


@pytest.mark.parametrize("name", LIBRARIES)
def test_a_step_without_zero_grad_raises_value_error(name: str) -> None:
    model = lib(name, "grad_sample").GradSampleModule(mlp())
    optimizer = lib(name, "optimizers").DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=8
    )
    x, y = dataset()[:8]
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match="haven't been cleared since the last optimizer step"):
        optimizer.step()


@pytest.mark.parametrize("name", LIBRARIES)
def test_check_processed_flag_passes_fresh_tensors_and_refuses_a_marked_one(name: str) -> None:
    helpers = lib(name, "optimizers.optimizer")
    t = torch.zeros(2)
    helpers._check_processed_flag([t])
    helpers._mark_as_processed(t)
    with pytest.raises(ValueError, match="zero_grad"):
        helpers._check_processed_flag(t)
