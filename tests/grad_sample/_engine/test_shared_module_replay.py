"""A module reachable by two paths keeps its parameters through a torch.func replay.

PyTorch's ``functional_call`` leaves such a module holding the replay's tensors instead of
its parameters; the optimizer would then update parameters the model no longer uses.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook.testing import reference_grad_samples


class TwoParents(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Sequential(nn.Linear(4, 4), nn.PReLU(4))  # PReLU: the torch.func fallback in hooks mode
        self.a = nn.Sequential(shared, nn.Tanh())
        self.b = nn.Sequential(shared)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


@pytest.mark.parametrize("mode", ["functorch", "hooks"])
def test_parameters_survive_two_steps(mode: str) -> None:
    model = TwoParents().double()
    before = [id(p) for p in model.parameters()]
    wrapped = dpnotebook.wrap_model(model, mode, loss_reduction="sum")
    for _ in range(2):
        x, t = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
        (wrapped(x) * t).sum().backward()
        assert [id(p) for p in model.parameters()] == before
        assert all(isinstance(p, nn.Parameter) for p in model.parameters())
        expected = reference_grad_samples(model, [x], target=t)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad_sample, expected[name], msg=name)
        wrapped.zero_grad()
