"""A model compiled with ``torch.compile``, then trained privately: every mode keeps the bound.

Users compile their model and hand the compiled module to ``make_private`` (or wrap it). Dynamo
traces the model into graphs and runs the library's hooks eagerly between them, so the per-sample
path must give the same clipped sum as on the plain model. The auditor's grid points are run on the
compiled model (``run_point(..., compile_backend=...)``, also ``python -m dpnotebook.audit --compile
inductor``): each must stay within ``C`` and equal the float64 reference clipped sum, or be refused
as on the plain model. On the CPU, compiling does not make the DP step faster (docs/performance.md).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

import dpnotebook
from dpnotebook.audit import grid, matches, run_point
from dpnotebook.modes import available_modes
from dpnotebook.privacy import PrivacyEngine

#: Two forward passes before one backward, summed losses, flat clipping: the hardest layout the grid has.
HARD = dict(loss_reduction="sum", clipping="flat", passes=2)


def _points(mode: str, families: list[str], records: list[str]) -> list:
    # ew refuses two forward passes before one backward on the plain model too: one pass there
    hard = HARD | {"passes": 1} if mode == "ew" else HARD
    return [
        p
        for p in grid(modes=[mode], families=families, records=records, Ks=[3])
        if all(getattr(p, k) == v for k, v in hard.items())
    ]


def _broken(points: list, backend: str) -> list[str]:
    """The points that break the promise; fails if none ran a compiled model (all refused: nothing tested)."""
    broken, ran = [], 0
    for point in points:
        counters.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = run_point(point, compile_backend=backend)
        if outcome.error is None:  # a kept point ran the compiled model
            assert counters["stats"]["unique_graphs"] > 0, point.name
            ran += 1
        if why := matches(outcome):
            broken.append(f"{point.name}: {why}")
    assert ran, f"every point was refused: no compiled model ran ({[p.name for p in points]})"
    return broken


@pytest.mark.parametrize("mode", available_modes())
def test_compiled_model_keeps_the_bound_eager_backend(mode: str) -> None:
    points = _points(mode, ["mlp"] if mode == "ew" else ["fallback"], ["scale_1e4"])  # ew: no rule for prelu
    assert points
    assert not _broken(points, "eager")


@pytest.mark.slow
@pytest.mark.parametrize("mode", available_modes())
def test_compiled_model_keeps_the_bound_inductor(mode: str) -> None:
    points = _points(mode, ["mlp", "conv", "fallback", "tied"], ["scale_1e4", "cancelling_copies"])
    assert len(points) >= 4
    assert not _broken(points, "inductor")


def test_make_private_trains_a_compiled_model_like_the_plain_one() -> None:
    """One step of SGD (σ = 0) through the Opacus-style engine, compiled model against plain model."""

    def step(compiled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        data = TensorDataset(torch.randn(16, 4, dtype=torch.float64) * 5, torch.randint(0, 3, (16,)))
        module = torch.compile(model, backend="eager") if compiled else model
        engine = PrivacyEngine()
        private, optimizer, loader = engine.make_private(
            module=module,
            optimizer=torch.optim.SGD(module.parameters(), lr=1.0),
            data_loader=DataLoader(data, batch_size=8),
            noise_multiplier=0.0,
            max_grad_norm=0.5,
            noise_generator=torch.Generator().manual_seed(1),
        )
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(private(x), y).backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    torch.compiler.reset()
    for got, want in zip(step(True), step(False), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_run_point_refuses_an_unknown_backend() -> None:
    point = next(grid(modes=["hooks"], families=["mlp"], records=["gaussian"]))
    with pytest.raises(ValueError, match=r"compile_backend='inductr' is unknown.*inductor"):
        run_point(point, compile_backend="inductr")


def test_wrapping_a_compiled_model_keeps_it_compiled() -> None:
    for mode in available_modes():
        compiled = torch.compile(nn.Linear(3, 2), backend="eager")
        wrapped = dpnotebook.wrap_model(compiled, mode)
        assert wrapped.to_standard_module() is compiled, mode
