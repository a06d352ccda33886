"""Accumulated ``grad_sample`` (issue #33.10): a list with one tensor per backward pass, as in Opacus.

Opacus' own tests of it, as user scripts run with both libraries:
``gradient_accumulation_test.py::test_grad_sample_accumulation`` (a ``GradSampleModule`` from
``get_gsm_class``, 8 backward passes: a list of 8 per-pass tensors whose rows average to the
full-data gradient) and ``test_privacy_engine_no_poisson_accumulation`` (``make_private`` without
Poisson sampling, 8 backward passes, one step: ``accumulated_iterations == 8``, ``grad_samples`` of
``8 * B`` rows, and the step's ``p.grad`` the full-data gradient). Under Poisson sampling both refuse
two batches before one step (:mod:`tests.compat.test_semantics`; checked here on the list form too).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, lib, loader

BATCH, PASSES = 4, 8


def model_with_frozen_parts(seed: int = 0) -> nn.Module:
    """As Opacus' SampleConvNet: a fully frozen layer and a partially frozen one between trained ones."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3))
    for p in model[2].parameters():
        p.requires_grad = False
    model[3].weight.requires_grad = False
    return model


def full_data_gradient() -> torch.Tensor:
    model = model_with_frozen_parts()
    for x, y in loader(dataset(n=BATCH * PASSES), batch_size=BATCH):
        nn.functional.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]) / PASSES


def grad_sample_accumulation_script(name: str, mode: str) -> dict:
    """Opacus' test_grad_sample_accumulation, its imports switched to ``name``."""
    model = model_with_frozen_parts()
    gsm = lib(name, "grad_sample.utils").get_gsm_class(mode)(model)
    for x, y in loader(dataset(n=BATCH * PASSES), batch_size=BATCH):
        nn.functional.cross_entropy(gsm(x), y).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    return {
        "frozen_without_grad_sample": all(
            getattr(p, "grad_sample", None) is None for p in model.parameters() if not p.requires_grad
        ),
        "types": {type(p.grad_sample).__name__ for p in trained},
        "shapes": [[tuple(g.shape) for g in p.grad_sample] for p in trained],
        "mean_rows": torch.cat([torch.cat(p.grad_sample).reshape(BATCH * PASSES, -1) for p in trained], 1).mean(0),
        "parts": [g.clone() for p in trained for g in p.grad_sample],
    }


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_grad_sample_accumulation_as_in_opacus(mode: str) -> None:
    runs = {name: grad_sample_accumulation_script(name, mode) for name in LIBRARIES}
    o, d = runs["opacus"], runs["dpnotebook"]
    assert d["frozen_without_grad_sample"] and o["frozen_without_grad_sample"]
    assert d["types"] == o["types"] == {"list"}
    assert d["shapes"] == o["shapes"] and all(len(s) == PASSES and s[0][0] == BATCH for s in d["shapes"])
    for a, b in zip(d["parts"], o["parts"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    reference = full_data_gradient()  # the per-sample gradients average to the full-data gradient
    torch.testing.assert_close(d["mean_rows"], reference, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(o["mean_rows"], reference, rtol=1e-3, atol=1e-5)


def no_poisson_accumulation_script(name: str, mode: str) -> dict:
    """Opacus' test_privacy_engine_no_poisson_accumulation, its imports switched to ``name``."""
    model = model_with_frozen_parts()
    engine = lib(name).PrivacyEngine()
    model, optimizer, data = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=loader(dataset(n=BATCH * PASSES), batch_size=BATCH),
        noise_multiplier=0.0,
        max_grad_norm=999.0,
        poisson_sampling=False,
        grad_sample_mode=mode,
    )
    for x, y in data:
        nn.functional.cross_entropy(model(x), y).backward()
    run = {"iterations": optimizer.accumulated_iterations, "rows": [g.shape[0] for g in optimizer.grad_samples]}
    optimizer.step()
    run["grad"] = torch.cat([p.grad.flatten() for p in optimizer.params])
    return run


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_no_poisson_accumulation_steps_on_every_pass_as_in_opacus(mode: str) -> None:
    runs = {name: no_poisson_accumulation_script(name, mode) for name in LIBRARIES}
    o, d = runs["opacus"], runs["dpnotebook"]
    assert d["iterations"] == o["iterations"] == PASSES
    assert d["rows"] == o["rows"] == [BATCH * PASSES] * len(d["rows"])
    torch.testing.assert_close(d["grad"], o["grad"], rtol=1e-4, atol=1e-6)
    # the step divides by expected_batch_size * accumulated_iterations: the full-data gradient
    torch.testing.assert_close(d["grad"], full_data_gradient(), rtol=1e-3, atol=1e-5)


def test_poisson_accumulation_is_still_refused_on_the_list_form() -> None:
    model = model_with_frozen_parts()
    model, optimizer, data = (
        lib("dpnotebook")
        .PrivacyEngine()
        .make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader(dataset(n=64), batch_size=16),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    )
    batches = iter(data)
    for _ in range(2):
        x, y = next(batches)
        nn.functional.cross_entropy(model(x), y).backward()
    held = model._module[0].weight.grad_sample
    assert isinstance(held, list) and len(held) == 2
    with pytest.raises(RuntimeError, match=r"clipped the samples of 2 Poisson batches.*epsilon would be under-counted"):
        optimizer.step()
