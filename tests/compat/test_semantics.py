"""Item 8: behaviours checked against Opacus and documented in docs/migration-from-opacus.md.

* two forward passes of one Poisson batch before one backward: Opacus sums them into one row per
  example; dpnotebook keeps both passes' rows, and its optimizer refuses the step (stricter);
* a step without ``zero_grad``: Opacus refuses the second backward under Poisson sampling;
  dpnotebook's step consumes its batch's per-sample gradients, so the next step is its own batch;
* two Poisson batches before one step: both refuse (dpnotebook: epsilon would be under-counted);
* an unsupported model: both raise something an Opacus user's ``except NotImplementedError`` catches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, lib, loader, mlp


def private(name: str):
    model = mlp()
    engine = lib(name).PrivacyEngine()
    model, optimizer, data = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader(dataset()),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    return model, optimizer, iter(data), engine


def test_two_forward_passes_before_one_backward() -> None:
    shapes = {}
    for name in LIBRARIES:
        model = lib(name, "grad_sample").GradSampleModule(mlp())
        x, y = dataset()[:4]
        (nn.functional.cross_entropy(model(x), y) + nn.functional.cross_entropy(model(2 * x), y)).backward()
        shapes[name] = tuple(model._module[0].weight.grad_sample.shape)
    assert shapes == {"opacus": (4, 8, 5), "dpnotebook": (8, 8, 5)}
    model, optimizer, batches, _ = private("dpnotebook")
    x, y = next(batches)
    (nn.functional.cross_entropy(model(x), y) + nn.functional.cross_entropy(model(2 * x), y)).backward()
    with pytest.raises(RuntimeError, match="two forward passes of the batch before one backward"):
        optimizer.step()


def test_a_step_without_zero_grad() -> None:
    """Both refuse (issue #33.2): Opacus at the second backward (Poisson), dpnotebook at the step, naming zero_grad."""
    model, optimizer, batches, _ = private("opacus")
    for i in range(2):
        x, y = next(batches)
        if i == 0:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        else:
            with pytest.raises(ValueError, match="grad accumulation"):
                nn.functional.cross_entropy(model(x), y).backward()
    model, optimizer, batches, engine = private("dpnotebook")
    x, y = next(batches)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    x, y = next(batches)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match=r"haven't been cleared since the last optimizer step.*zero_grad\(\)"):
        optimizer.step()
    assert len(engine.accountant) == 1


def test_two_poisson_batches_before_one_step_are_refused() -> None:
    for name, error in (("opacus", ValueError), ("dpnotebook", RuntimeError)):
        model, optimizer, batches, _ = private(name)
        with pytest.raises(error):
            for _ in range(2):
                x, y = next(batches)
                nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
