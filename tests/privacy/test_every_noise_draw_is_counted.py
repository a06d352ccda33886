"""The accountant counts where the noise is drawn: once per logical batch, whichever method drew it.

Before, the accountant's hook ran in ``step()`` and ``pre_step()`` only: a loop of ``optimizer.add_noise()``
then ``optimizer.original_optimizer.step()`` applied 3 noisy updates in every mode with 0 steps counted
(the epsilon reported was that of no training at all). And the Opacus-named ``DPOptimizer``'s
``add_noise`` wrote the noisy sum without the step's checks: a parameter frozen after ``backward()`` had its
raw gradient applied, unclipped.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook import PrivacyEngine, wrap_model
from dpnotebook._opacus.optimizers import DPOptimizer as OpacusDPOptimizer

MODES = ("hooks", "ghost", "functorch", "ew")


def _private(mode: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    engine = PrivacyEngine(secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=8),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            grad_sample_mode=mode,
            noise_generator=torch.Generator().manual_seed(1),
            sampling_generator=torch.Generator().manual_seed(2),
        )
    return engine, wrapped, optimizer, loader


@pytest.mark.parametrize("clip_first", [False, True], ids=["add_noise", "clip_and_accumulate+add_noise"])
@pytest.mark.parametrize("mode", MODES)
def test_a_loop_that_draws_noise_itself_is_counted(mode: str, clip_first: bool) -> None:
    engine, model, optimizer, loader = _private(mode)
    draws = 0
    for x, y in loader:
        optimizer.zero_grad()
        if len(y):
            nn.functional.cross_entropy(model(x), y).backward()
        if clip_first:  # Opacus' order inside pre_step: clip what is there, then the noise
            optimizer.clip_and_accumulate()
        optimizer.add_noise()
        optimizer.original_optimizer.step()
        draws += 1
        assert len(engine.accountant) == draws
    assert draws == len(loader) and engine.get_epsilon(1e-5) > 0


@pytest.mark.parametrize("mode", MODES)
def test_step_and_pre_step_count_once(mode: str) -> None:
    engine, model, optimizer, loader = _private(mode)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        if len(y):
            nn.functional.cross_entropy(model(x), y).backward()
        if i % 2:
            optimizer.step()
        else:
            assert optimizer.pre_step()
            optimizer.original_optimizer.step()
        assert len(engine.accountant) == i + 1


def test_opacus_add_noise_called_alone_makes_the_steps_checks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    wrapped = wrap_model(model, "hooks")
    optimizer = OpacusDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        expected_batch_size=8,
        secure_mode=False,
    )
    wrapped(torch.randn(8, 4) * 100).sum().backward()
    model[0].weight.requires_grad_(False)  # frozen after backward: its .grad is raw (before: moved by 0.40)
    optimizer.clip_and_accumulate()
    with pytest.raises(RuntimeError, match=r"'0.weight' has requires_grad=False but holds a .grad"):
        optimizer.add_noise()
