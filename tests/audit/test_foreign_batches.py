"""Foreign batches (issue #28.4), measured with a neighbour that keeps the batch size.

The neighbour D' of D sets one example's loss weight to 0: every batch keeps its size, so no
count of rows or examples can tell the two runs apart. With sigma = 0 and lr = 0 each step's
``p.grad`` is the clipped sum S of that step's batch. Over the DP loader's Poisson batches, S(D)
and S(D') differ by at most C, and only in the steps that happened to sample the example. Over
the caller's original loader (fixed batches of one) they differ by exactly C in one step known in
advance: that is a Gaussian mechanism without subsampling, not the Poisson step at q the
accountant counts. Such a loop is now refused at its first step, whatever the neighbour.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook.privacy import PrivacyEngine

N, C, TARGET = 20, 0.01, 7


def _clipped_sums(loop: str, weight_of_target: float, mode: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(N, 3, generator=gen, dtype=torch.float64),
        torch.randn(N, 1, generator=gen, dtype=torch.float64),
        torch.arange(N),
    )
    original = DataLoader(data, batch_size=1)
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    model, optimizer, loader = PrivacyEngine(accountant="rdp", secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=original,
        noise_multiplier=0.0,
        max_grad_norm=C,
        loss_reduction="sum",
        grad_sample_mode=mode,
        sampling_generator=torch.Generator().manual_seed(1),
    )
    weights = torch.ones(N, dtype=torch.float64)
    weights[TARGET] = weight_of_target
    sums = []
    for x, y, index in original if loop == "original" else loader:
        optimizer.zero_grad()
        losses = ((model(x) - y) ** 2).sum(1)
        (weights[index] * losses).sum().backward()
        optimizer.step()
        sums.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return sums


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_over_the_dp_loader_the_neighbour_moves_only_sampled_steps_by_at_most_c(mode: str) -> None:
    with_target = _clipped_sums("dp", 1.0, mode)
    without = _clipped_sums("dp", 0.0, mode)
    ratios = [float((a - b).norm()) / C for a, b in zip(with_target, without, strict=True)]
    assert max(ratios) <= 1 + 1e-9
    assert 0 < sum(r > 1e-12 for r in ratios) < len(ratios)  # the steps that sampled it, not all of them


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("weight", [1.0, 0.0])
def test_a_loop_over_the_original_loader_is_refused_for_either_neighbour(mode: str, weight: float) -> None:
    # before: both runs completed; S(D) - S(D') was exactly C in step 7 (the target's fixed batch)
    # and 0 in every other step, accounted as 20 Poisson steps at q = 1/20
    with pytest.raises(RuntimeError, match="handed out no batch since the last step"):
        _clipped_sums("original", weight, mode)
