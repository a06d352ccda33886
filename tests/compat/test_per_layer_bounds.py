"""Item 3: per-layer clipping with Opacus' list of bounds (one per parameter tensor), compared with Opacus,
and the list under the sensitivity auditor in every mode on adversarial records."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook.audit import RECORDS, audit_case, audit_sensitivity
from tests.compat.conftest import LIBRARIES
from tests.compat.scripts import dataset, flat_params, lib, loader, mlp

BOUNDS = [0.3, 0.05, 0.2, 0.01]  # Linear(5, 8).weight, .bias, Linear(8, 3).weight, .bias


def per_layer_script(name: str, noise: float) -> tuple[nn.Module, float, float]:
    model = mlp()
    engine = lib(name).PrivacyEngine(accountant="rdp")
    model, optimizer, data = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=loader(dataset()),
        noise_multiplier=noise,
        max_grad_norm=BOUNDS,
        clipping="per_layer",
        poisson_sampling=False,
    )
    for _ in range(2):
        for x, y in data:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model, optimizer.max_grad_norm, engine.get_epsilon(1e-5)


def test_per_layer_bounds_train_as_in_opacus() -> None:
    runs = {name: per_layer_script(name, noise=0.0) for name in LIBRARIES}
    torch.testing.assert_close(flat_params(runs["dpnotebook"][0]), flat_params(runs["opacus"][0]), rtol=1e-4, atol=1e-5)
    assert runs["dpnotebook"][1] == pytest.approx(runs["opacus"][1]) == pytest.approx(sum(c * c for c in BOUNDS) ** 0.5)


def test_per_layer_bounds_epsilon_as_in_opacus() -> None:
    eps = {name: per_layer_script(name, noise=1.2)[2] for name in LIBRARIES}
    assert eps["dpnotebook"] == pytest.approx(eps["opacus"], rel=0.01)


def test_wrong_number_of_bounds_is_named() -> None:
    model = dpnotebook.wrap_model(mlp())
    opt = dpnotebook.DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=[1.0, 1.0],
        expected_batch_size=4,
        clipping="per_layer",
    )
    x, y = dataset()[:4]
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match="2 per-layer bounds but there are 4 trainable parameter tensors"):
        opt.step()


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_per_layer_bounds_keep_the_sensitivity(mode: str) -> None:
    for record in RECORDS:
        if record == "cancelling_positions":
            continue  # needs a sequence family
        case = audit_case("mlp", record)
        model = case.model(True)
        bounds = [0.02 * (i + 1) for i, p in enumerate(model.parameters()) if p.requires_grad]
        report = audit_sensitivity(
            model,
            batch=lambda idx, case=case: case.batch(idx, K=2, batch_first=True),
            loss=case.loss(loss_reduction="mean", batch_first=True, K=2),
            num_samples=case.num_samples,
            mode=mode,
            K=2,
            clipping="per_layer",
            max_grad_norm=bounds,
        )
        assert report.ok(), (record, report.table())
        assert report.reference_gap < 1e-4, (record, report.reference_gap)
