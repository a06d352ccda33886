"""Ghost mode against crafted records: each sample moves the clipped sum by at most C.

Sensitivity is measured on the real optimizer path (``GhostDPOptimizer`` with
``noise_multiplier=0``): the clipped sum with every sample, minus the clipped
sum with sample ``s``'s loss multiplied by 0, must have norm ``<= C * (1 + 1e-5)``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import dpnotebook
from dpnotebook.grad_sample.samplers.linear_norm import linear_sq_norms
from dpnotebook.grad_sample.samplers.rnn_norm import shared_gram_sq_norms
from dpnotebook.privacy._optimizer import GhostDPOptimizer
from dpnotebook.testing import reference_grad_samples

SLACK = 1 + 1e-5


def clipped_sum(model: nn.Module, forward, mask: torch.Tensor, *, C: float, K: int = 1) -> list[torch.Tensor]:
    """The clipped sum of one step (sigma = 0) with sample ``b``'s loss multiplied by ``mask[b]``."""
    model = copy.deepcopy(model)
    wrapped = dpnotebook.wrap_model(model, "ghost", K=K, loss_reduction="sum")
    wrapped.allow_grad_accumulation()  # some tests run several forward passes before one backward
    opt = GhostDPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=1,
        loss_reduction="sum",
    )
    forward(wrapped, mask).backward()
    opt.step()
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def sensitivity(model: nn.Module, forward, B: int, *, C: float, K: int = 1) -> float:
    """``max_s ||S(D) - S(D with s's loss * 0)|| / C``."""
    full = clipped_sum(model, forward, torch.ones(B), C=C, K=K)
    worst = 0.0
    for s in range(B):
        mask = torch.ones(B)
        mask[s] = 0.0
        less = clipped_sum(model, forward, mask, C=C, K=K)
        diff = torch.sqrt(sum((a - b).pow(2).sum() for a, b in zip(full, less, strict=True)))
        worst = max(worst, float(diff) / C)
    return worst


def cancelling_batch(B: int, T: int, d: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``[B*K, T, d]`` and output weights: sample 0 has two nearly equal positions x1000 with opposite backprops."""
    torch.manual_seed(seed)
    x, v = torch.randn(B * K, T, d), torch.randn(B * K, T, d)
    base, w = torch.randn(d) * 1000, torch.randn(d)
    for k in range(K):  # every copy of sample 0
        x[k, 0], x[k, 1] = base, base + torch.randn(d) * 0.01
        v[k, 0], v[k, 1] = w, -w
        x[k, 2:], v[k, 2:] = 0.0, 0.0
    return x, v


@pytest.mark.parametrize("K", [1, 3])
def test_cancelling_positions_are_clipped_to_C_in_ghost_mode(K: int) -> None:
    B, T, d = 3, 4, 64
    torch.manual_seed(0)
    model = nn.Linear(d, d, bias=False)
    for seed in (10, 27):  # seeds whose float32 Gram norm of sample 0 came out negative
        x, v = cancelling_batch(B, T, d, K, seed)

        def forward(m, mask, x=x, v=v):
            per_row = (m(x) * v).sum((1, 2))
            return (per_row * mask.repeat_interleave(K)).sum()

        assert sensitivity(model, forward, B, C=1e-3, K=K) <= SLACK


def test_gram_norms_never_fall_below_the_true_norm_under_cancellation() -> None:
    worst = float("inf")
    for seed in range(60):
        torch.manual_seed(seed)
        base, w = torch.randn(64) * 1000, torch.randn(64)
        A = torch.stack([base, base + torch.randn(64) * 0.05]).unsqueeze(0)
        G = torch.stack([w, -w]).unsqueeze(0)
        true = linear_sq_norms(A.double(), G.double(), strategy="direct")
        ratios = [linear_sq_norms(A, G, strategy="gram") / true, shared_gram_sq_norms([A, A], G)[1] / true]
        worst = min([worst] + [float(r) for r in ratios])
    assert worst >= 1.0 - 1e-6


def test_embedding_frozen_after_the_forward_pass_gives_no_norms() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    wrapped = dpnotebook.wrap_model(model, "ghost")
    wrapped(torch.randint(0, 10, (5, 3))).sum().backward()
    model[0].weight.requires_grad_(False)
    norms = wrapped.sq_norms()
    assert model[0].weight not in norms and norms[model[2].weight].shape == (5,)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_a_sample_with_a_non_finite_norm_adds_nothing(bad: float, clipping: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.PReLU(), nn.Linear(8, 3))  # PReLU: left to the hooks engine
    x = torch.randn(5, 6, 4)
    x[0, 2, 1] = bad

    def step(inputs: torch.Tensor) -> list[torch.Tensor]:
        m = copy.deepcopy(model)
        wrapped = dpnotebook.wrap_model(m, "ghost", loss_reduction="sum")
        opt = GhostDPOptimizer(
            torch.optim.SGD(wrapped.parameters(), lr=0.0),
            noise_multiplier=0.0,
            max_grad_norm=1.0,
            expected_batch_size=1,
            loss_reduction="sum",
            clipping=clipping,
        )
        wrapped(inputs).sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # clip_factors may warn about the non-finite norm
            opt.step()
        return [p.grad.clone() for p in m.parameters()]

    for got, want in zip(step(x), step(x[1:]), strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def two_pass_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2))  # PReLU: left to the hooks engine


def two_pass_sum(model: nn.Module, xs: list[torch.Tensor], scales: list[float], K: int, C: float) -> list[torch.Tensor]:
    """The clipped sum (sigma = 0) of one backward over the forward passes of ``xs``, losses times ``scales``."""
    model = copy.deepcopy(model)
    wrapped = dpnotebook.wrap_model(model, "ghost", K=K, loss_reduction="sum")
    wrapped.allow_grad_accumulation()
    opt = GhostDPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=1,
        loss_reduction="sum",
    )
    sum(wrapped(x).sum() * s for x, s in zip(xs, scales, strict=True)).backward()
    opt.step()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("swap", [False, True])
def test_two_forward_passes_one_backward_with_a_hooks_layer(K: int, swap: bool) -> None:
    model = two_pass_model()
    torch.manual_seed(1)
    zero, real = torch.randn(K, 3) * 5, torch.randn(K, 3) * 5
    xs, scales = ([real, zero], [1.0, 0.0]) if swap else ([zero, real], [0.0, 1.0])
    both = two_pass_sum(model, xs, scales, K, C=0.1)
    alone = two_pass_sum(model, [real], [1.0], K, C=0.1)  # the zero-loss sample must change nothing
    neither = two_pass_sum(model, xs, [0.0, 0.0], K, C=0.1)
    for got, want in zip(both, alone, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    diff = torch.sqrt(sum((a - b).pow(2).sum() for a, b in zip(both, neither, strict=True)))
    assert float(diff) <= 0.1 * SLACK


def test_a_block_with_another_number_of_samples_is_refused() -> None:
    wrapped = dpnotebook.wrap_model(two_pass_model(), "ghost", loss_reduction="sum")
    wrapped.allow_grad_accumulation()
    wrapped(torch.randn(2, 3)).sum().backward()
    ledger = wrapped._ledger
    with pytest.raises(
        dpnotebook.GradSampleError,
        match=r"forward pass 1: the ghosted layers saw 2 samples but the hooks engine gave .* 3 per-sample",
    ):
        ledger.layout({next(iter(wrapped.parameters())): [(1, 3)]}, wrapped._store._name)


class Branches(nn.Module):
    """A ghosted Linear and a PReLU (left to the hooks engine); each forward pass picks which it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(3, 3), nn.PReLU(3)

    def forward(self, x: torch.Tensor, which: str) -> torch.Tensor:
        if which == "fc":
            return self.fc(x)
        return self.act(x) if which == "act" else self.act(self.fc(x))


@pytest.mark.parametrize("K", [1, 3])
def test_forward_passes_reaching_different_layers_are_aligned_by_forward_id(K: int) -> None:
    # ghosted layers see passes 1 and 2 (2 + 3 samples), the PReLU passes 2 and 3 (3 + 2): equal totals
    torch.manual_seed(0)
    model = Branches()
    passes = [
        (torch.randn(2 * K, 3) * 3, "fc"),
        (torch.randn(3 * K, 3) * 3, "both"),
        (torch.randn(2 * K, 3) * 3, "act"),
    ]

    def forward(m, mask):
        losses, start = [], 0
        for x, which in passes:
            B = x.shape[0] // K
            per_row = m(x, which).sum(1) * mask[start : start + B].repeat_interleave(K)
            losses.append(per_row.sum())
            start += B
        return sum(losses)

    assert sensitivity(model, forward, 7, C=0.1, K=K) <= SLACK


class OutsideUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + nn.functional.linear(x, self.fc.weight)  # the weight again, outside its layer


def test_a_ghosted_weight_used_outside_its_layer_is_refused() -> None:
    wrapped = dpnotebook.wrap_model(OutsideUse(), "ghost")
    with pytest.raises(dpnotebook.GradSampleError, match="outside its module's forward"):
        wrapped(torch.randn(4, 3)).sum().backward()
        wrapped.sq_norms()


class Shared(nn.Module):
    """One Linear reachable from two parents."""

    def __init__(self) -> None:
        super().__init__()
        fc = nn.Linear(3, 3)
        self.a, self.b = nn.Sequential(fc, nn.Tanh()), nn.Sequential(fc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@pytest.mark.parametrize("K", [1, 2])
def test_a_layer_reachable_from_two_parents_is_counted_once(K: int) -> None:
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(4 * K, 3) * 3

    def forward(m, mask):
        return (m(x).sum(1) * mask.repeat_interleave(K)).sum()

    assert sensitivity(model, forward, 4, C=0.1, K=K) <= SLACK
    wrapped = dpnotebook.wrap_model(copy.deepcopy(model), "ghost", K=K, loss_reduction="sum")
    forward(wrapped, torch.ones(4)).backward()
    ref = reference_grad_samples(model, (x,), target=torch.ones(4 * K, 3), loss_fn=lambda o, t: (o * t).sum(), K=K)
    want = torch.stack([r.flatten(1).pow(2).sum(1) for r in ref.values()]).sum(0).sqrt()
    torch.testing.assert_close(wrapped.per_sample_norms().double(), want, rtol=1e-4, atol=1e-6)


def test_calling_the_inner_module_is_refused() -> None:
    model = nn.Linear(3, 2)
    dpnotebook.wrap_model(model, "ghost")
    with pytest.raises(dpnotebook.GradSampleError, match="outside the GhostGradSampleModule's forward"):
        model(torch.randn(2, 3))


@pytest.mark.parametrize("K", [1, 2])
def test_large_inputs_zero_losses_and_cancelling_copies(K: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(5 * K, 6, 8) * 1e4
    x[:K] = x[0]  # sample 0's copies are equal ...
    sign = torch.ones(5 * K)
    sign[1:K] = -1.0  # ... with opposite losses: they cancel (K = 2)

    def forward(m, mask):
        per_row = m(x).sum((1, 2)) * sign * mask.repeat_interleave(K)
        per_row = per_row * (torch.arange(5 * K) // K != 4)  # sample 4: zero loss
        return per_row.sum()

    assert sensitivity(model, forward, 5, C=0.1, K=K) <= SLACK


def test_an_empty_batch_adds_nothing() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2))
    wrapped = dpnotebook.wrap_model(model, "ghost", loss_reduction="sum")
    opt = GhostDPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        expected_batch_size=1,
        loss_reduction="sum",
    )
    wrapped(torch.randn(0, 3)).sum().backward()
    opt.step()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
