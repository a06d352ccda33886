"""A forward pass with gradients on that gets no backward (a metric outside ``torch.no_grad()``) adds nothing.

In every mode the step is exactly the one the real batch gives: hooks and functorch mode form
per-sample gradients only in backward, ew mode sets earlier samples aside only when a backward
pass reaches the new forward pass, and ghost mode's ledger leaves out forward passes that no
backward reached (before, ghost counted their rows, "clipped 22 ... sampled 11", and ew refused a
stray forward pass after the backward as an unwrapped model).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook import GradSampleError, wrap_model
from dpnotebook.privacy import PrivacyEngine
from dpnotebook.privacy._optimizer import GhostDPOptimizer

MODES = ("hooks", "ew", "functorch", "ghost")
SCENARIOS = ("before", "after", "two", "none")


def _step(mode: str, K: int, scenario: str, empty: bool = False) -> list[Tensor]:
    """The update of one DP step (σ = 0) on a Poisson batch, with stray forward passes per ``scenario``."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(40, 3, dtype=torch.float64), torch.randn(40, 1, dtype=torch.float64))
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    model, optimizer, loader = PrivacyEngine(secure_mode=False).make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        data_loader=DataLoader(data, batch_size=2 if empty else 11),
        noise_multiplier=0.0,
        max_grad_norm=0.1,
        K=K,
        grad_sample_mode=mode,
        loss_reduction="sum",
        sampling_generator=torch.Generator().manual_seed(3),
    )
    x, y = next(b for b in loader if (len(b[0]) == 0) == empty)
    x = x.repeat_interleave(K, 0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    strays = {"before": 1, "two": 2}.get(scenario, 0)
    for _ in range(strays):
        model(x).sum()  # a training metric computed with gradients on: no backward
    out = model(x).view(-1, K, 1).mean(1)
    nn.functional.mse_loss(out, y, reduction="sum").backward()
    if scenario == "after":
        model(x).sum()
    optimizer.step()
    return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]


@pytest.mark.parametrize("scenario", SCENARIOS[:3])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_a_forward_pass_without_backward_changes_nothing(mode: str, K: int, scenario: str) -> None:
    got, want = _step(mode, K, scenario), _step(mode, K, "none")
    assert max((a - b).abs().max().item() for a, b in zip(got, want, strict=True)) <= 1e-12
    assert min(u.abs().max().item() for u in want) > 1e-3  # the step moved every parameter


@pytest.mark.parametrize("mode", ("hooks", "functorch", "ghost"))  # ew refuses an empty batch
def test_a_forward_pass_without_backward_on_an_empty_batch_changes_nothing(mode: str) -> None:
    got, want = _step(mode, 1, "before", empty=True), _step(mode, 1, "none", empty=True)
    assert max((a - b).abs().max().item() for a, b in zip(got, want, strict=True)) <= 1e-12


def test_ghost_wrap_model_drops_the_stray_forward_pass_from_norms_and_counts() -> None:
    torch.manual_seed(0)
    model = wrap_model(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double(), "ghost")
    x = torch.randn(5, 3, dtype=torch.float64)
    model(torch.randn(7, 3, dtype=torch.float64)).sum()  # no backward
    model(x).pow(2).sum().backward()
    norms = model.per_sample_norms()
    model.zero_grad()
    model(x).pow(2).sum().backward()
    assert model.num_samples() == 5 and torch.equal(norms, model.per_sample_norms())
    opt = GhostDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=5
    )
    model(x).sum()  # after the backward, before the step
    opt.step()
    assert opt.last_step_stats.batch_size == 5


@pytest.mark.parametrize("K", [1, 3])
def test_ew_refuses_a_second_backward_through_one_forward_pass(K: int) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    wrapped = wrap_model(model, "ew", loss_reduction="sum", K=K)
    out = wrapped(torch.randn(2 * K, 3))
    out.pow(2).sum().backward(retain_graph=True)
    with pytest.raises(GradSampleError, match=r"second backward pass through the same forward pass.*Fix: add the los"):
        out.sum().backward()


def test_ew_keeps_two_forward_passes_apart_when_their_backward_passes_come_later() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    rows = []
    for interleaved in (True, False):
        torch.manual_seed(1)
        model = nn.Linear(3, 1)
        wrapped = wrap_model(model, "ew", loss_reduction="sum")
        if interleaved:
            oa, ob = wrapped(a), wrapped(b)
            oa.sum().backward()
            ob.pow(2).sum().backward()
        else:
            wrapped(a).sum().backward()
            wrapped(b).pow(2).sum().backward()
        rows.append(torch.cat(model.weight.grad_sample))
    assert torch.allclose(rows[0], rows[1])


@pytest.mark.parametrize("mode", ("hooks", "functorch"))
def test_a_second_backward_through_one_forward_pass_is_refused_naming_the_mode(mode: str) -> None:
    wrapped = wrap_model(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)), mode, K=3)
    out = wrapped(torch.randn(6, 3))
    out.pow(2).sum().backward(retain_graph=True)
    with pytest.raises(GradSampleError, match=rf"retain_graph=True\), but {mode} mode has let go"):
        out.sum().backward()
