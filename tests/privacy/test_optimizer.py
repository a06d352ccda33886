"""DPOptimizer: equals SGD without privacy, noise-only empty steps, K copies, virtual steps."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpnotebook import wrap_model
from dpnotebook.privacy import BatchMemoryManager, DPDataLoader, DPOptimizer, gaussian_noise, split_batch


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def batch(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def dp_setup(mode="hooks", *, sigma=1.0, C=1.0, ebs=8, reduction="mean", K=1, seed=0, clipping="flat", lr=0.5):
    model = wrap_model(tiny_model(), mode, K=K, loss_reduction=reduction)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        noise_multiplier=sigma,
        max_grad_norm=C,
        expected_batch_size=ebs,
        loss_reduction=reduction,
        clipping=clipping,
        generator=torch.Generator().manual_seed(seed),
    )
    return model, opt


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_no_noise_no_clipping_equals_plain_sgd(mode, reduction):
    x, y = batch()
    model, opt = dp_setup(mode, sigma=0.0, C=1e9, ebs=len(x), reduction=reduction)
    plain = tiny_model()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.5)

    F.cross_entropy(model(x), y, reduction=reduction).backward()
    opt.step()
    F.cross_entropy(plain(x), y, reduction=reduction).backward()
    plain_opt.step()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert opt.last_step_stats.fraction_clipped == 0.0


class Tempered(nn.Module):
    """A linear layer divided by a learned 0-d temperature."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.t = nn.Linear(4, 3), nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / self.t


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
def test_zero_dim_parameter_equals_plain_sgd(mode):
    """A scalar parameter (per-sample gradients of shape [B]) is clipped and stepped like any other."""
    from dpnotebook.privacy import GhostDPOptimizer

    x, y = batch()
    model = wrap_model(Tempered(), mode)
    cls = GhostDPOptimizer if mode == "ghost" else DPOptimizer
    opt = cls(
        torch.optim.SGD(model.parameters(), lr=0.5), noise_multiplier=0.0, max_grad_norm=1e9, expected_batch_size=len(x)
    )
    plain = Tempered()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    for m, o in ((model, opt), (plain, plain_opt)):
        F.cross_entropy(m(x), y).backward()
        o.step()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert opt.last_step_stats.per_sample_norms.shape == (len(x),)


@pytest.mark.parametrize("forward", [False, True])
def test_empty_batch_moves_parameters_by_noise_only(forward):
    model, opt = dp_setup(sigma=1.3, C=0.7, ebs=8, lr=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    if forward:  # a zero-row batch through the model: grad_sample has 0 rows
        x, y = torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)
        F.cross_entropy(model(x), y, reduction="sum").backward()
    opt.step()
    gen = torch.Generator().manual_seed(0)
    for p, b in zip(model.parameters(), before, strict=True):
        noise = gaussian_noise(p.shape, std=1.3 * 0.7, generator=gen, device=p.device)  # a CPU draw, moved
        torch.testing.assert_close(p.detach(), b - 0.5 * noise / 8)
    stats = opt.last_step_stats
    assert stats.batch_size == 0 and stats.clipped_sum_norm == 0.0 and stats.noise_std == pytest.approx(0.91)


def test_noise_std_of_the_private_gradient():
    model = wrap_model(nn.Linear(300, 300), "hooks")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=2.0,
        max_grad_norm=0.5,
        expected_batch_size=10,
        generator=torch.Generator().manual_seed(0),
    )
    opt.add_noise()  # empty batch: the gradient is noise / 10
    noise = model.weight.grad * 10
    assert abs(noise.std().item() / (2.0 * 0.5) - 1) < 0.03


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_k_identical_copies_give_the_k1_update(mode):
    x, y = batch(6)
    model1, opt1 = dp_setup(mode, sigma=0.8, C=0.1, ebs=6, K=1, seed=5)
    model4, opt4 = dp_setup(mode, sigma=0.8, C=0.1, ebs=6, K=4, seed=5)
    F.cross_entropy(model1(x), y).backward()
    F.cross_entropy(model4(x.repeat_interleave(4, dim=0)), y.repeat_interleave(4)).backward()
    opt1.step()
    opt4.step()
    assert opt1.last_step_stats.fraction_clipped == 1.0  # C=0.1 clips: the test covers clipping
    for p, q in zip(model1.parameters(), model4.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_virtual_steps_equal_one_big_step():
    x, y = batch(10)
    big, big_opt = dp_setup(sigma=1.0, C=0.3, ebs=10, seed=2)
    F.cross_entropy(big(x), y).backward()
    big_opt.step()

    small, small_opt = dp_setup(sigma=1.0, C=0.3, ebs=10, seed=2)
    for xb, yb in split_batch((x, y), max_physical_batch_size=3):
        F.cross_entropy(small(xb), yb).backward()
        small_opt.virtual_step()
    small_opt.step()
    for p, q in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert small_opt.last_step_stats.virtual_steps == 5
    torch.testing.assert_close(small_opt.last_step_stats.per_sample_norms, big_opt.last_step_stats.per_sample_norms)


def test_batch_memory_manager_equals_one_big_step():
    data = torch.utils.data.TensorDataset(*batch(40))
    results = []
    for physical in (None, 4):
        model, opt = dp_setup(sigma=1.0, C=0.3, ebs=20, seed=3)
        loader = DPDataLoader(data, sample_rate=0.5, steps=2, generator=torch.Generator().manual_seed(9))
        if physical is None:
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        else:
            with BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical, optimizer=opt) as batches:
                for x, y in batches:
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
            assert opt.last_step_stats.virtual_steps > 1
        results.append([p.detach().clone() for p in model.parameters()])
    for p, q in zip(*results, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_stats_zero_grad_and_per_layer():
    x, y = batch()
    model, opt = dp_setup(C=0.05, clipping="per_layer")
    F.cross_entropy(model(x), y).backward()
    opt.step()
    stats = opt.last_step_stats
    assert stats.batch_size == 8 and stats.fraction_clipped == 1.0 and stats.virtual_steps == 1
    assert stats.per_sample_norms.shape == (8,) and stats.noise_norm > 0 and stats.clipped_sum_norm > 0
    F.cross_entropy(model(x), y).backward()
    opt.zero_grad()
    assert all(p.grad_sample is None and p.grad is None for p in model.parameters())


def test_lr_scheduler_and_closure_and_state_dict():
    x, y = batch()
    model, opt = dp_setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    assert opt.step(closure) is not None
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.25
    copy.deepcopy(opt.state_dict())


def test_gradients_without_grad_sample_raise():
    plain = tiny_model()
    opt = DPOptimizer(
        torch.optim.SGD(plain.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8
    )
    x, y = batch()
    F.cross_entropy(plain(x), y).backward()
    with pytest.raises(RuntimeError, match="no .grad_sample"):
        opt.step()


def test_step_hooks_run_after_each_step_only():
    model, opt = dp_setup()
    calls = []
    opt.attach_step_hook(lambda o: calls.append(o.noise_multiplier))
    opt.signal_skip_step(True)
    opt.step()
    opt.step()
    assert calls == [1.0]
