"""``p.grad_sample`` after several backward passes before one step: a list, one tensor per pass (issue #33.10).

As in Opacus (``promote_current_grad_sample``). Every reader goes through
:func:`~dpnotebook.grad_sample._engine.accumulation.grad_sample_rows`; a DP step clips every
pass's rows once; a forward pass's samples stay in one tensor (one row per sample).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from dpnotebook import GradSampleError, wrap_model
from dpnotebook.audit import audit_case, audit_sensitivity
from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts, grad_sample_rows
from dpnotebook.privacy import clip_and_sum
from dpnotebook.privacy._optimizer import DPOptimizer

LIST_MODES = ("hooks", "functorch", "ew")


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def batches() -> list[Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, 3, generator=g) for n in (2, 5, 1)]


def one_pass(mode: str, x: Tensor) -> dict[str, Tensor]:
    model = mlp()
    wrapped = wrap_model(model, mode, loss_reduction="sum")
    wrapped(x).pow(2).sum().backward()
    return {n: p.grad_sample.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", LIST_MODES)
def test_three_backward_passes_leave_a_list_of_each_pass_rows(mode: str) -> None:
    model = mlp()
    wrapped = wrap_model(model, mode, loss_reduction="sum")
    xs = batches()
    for x in xs:
        wrapped(x).pow(2).sum().backward()
    alone = [one_pass(mode, x) for x in xs]
    for name, p in model.named_parameters():
        assert isinstance(p.grad_sample, list)
        assert [tuple(g.shape) for g in p.grad_sample] == [(len(x), *p.shape) for x in xs]
        for got, ref in zip(p.grad_sample, alone, strict=True):
            torch.testing.assert_close(got, ref[name])
        assert torch.equal(grad_sample_rows(p), torch.cat(p.grad_sample))
    wrapped.zero_grad()
    assert all(p.grad_sample is None for p in model.parameters())
    wrapped(xs[0]).sum().backward()
    assert all(isinstance(p.grad_sample, Tensor) for p in model.parameters())  # one pass: one tensor


class Gain(nn.Module):
    """A layer no sampler is registered for: ghost mode leaves it to the hooks engine (torch.func)."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gain


def test_ghost_forms_no_grad_sample_for_its_layers_and_a_list_for_the_others() -> None:
    model = nn.Sequential(nn.Linear(3, 4), Gain(), nn.Linear(4, 2))
    wrapped = wrap_model(model, "ghost", loss_reduction="sum")
    wrapped.allow_grad_accumulation()
    for x in batches():
        wrapped(x).pow(2).sum().backward()
    assert getattr(model[0].weight, "grad_sample", None) is None  # ghosted: norms only
    assert getattr(model[2].weight, "grad_sample", None) is None
    held = [g.shape[0] for g in grad_sample_parts(model[1].gain)]  # left to the hooks engine
    assert held == [2, 5, 1]
    assert wrapped.per_sample_norms().shape == (8,)  # the ghost norms and the list line up, pass by pass


def test_two_forward_passes_backward_in_reverse_order_keep_each_pass_together() -> None:
    model = mlp()
    wrapped = wrap_model(model, "hooks", loss_reduction="sum")
    a, b, _ = batches()
    loss_a, loss_b = wrapped(a).pow(2).sum(), wrapped(b).pow(2).sum()
    loss_b.backward()
    loss_a.backward()
    assert [g.shape[0] for g in model[0].weight.grad_sample] == [5, 2]
    assert wrapped._store.blocks(model[0].weight) == [(2, 5), (1, 2)]  # (forward pass, samples) in row order
    torch.testing.assert_close(model[0].weight.grad_sample[1], one_pass("hooks", a)["0.weight"])


@pytest.mark.parametrize("mode", LIST_MODES)
def test_a_dp_step_over_the_list_is_the_clipped_sum_of_every_row(mode: str) -> None:
    model = mlp()
    wrapped = wrap_model(model, mode, loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=0.1,
        expected_batch_size=8,
        loss_reduction="sum",
    )
    for x in batches():
        wrapped(x * 10).pow(2).sum().backward()
    params = list(model.parameters())
    rows = [grad_sample_rows(p).clone() for p in params]
    assert opt.accumulated_iterations == 3 and [g.shape[0] for g in opt.grad_samples] == [8] * 4
    expected = clip_and_sum(rows, max_grad_norm=0.1).summed
    opt.add_noise()
    for p, want in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, want)
    assert opt.last_step_stats is not None and opt.last_step_stats.batch_size == 8


def test_a_backward_pass_after_a_step_without_zero_grad_is_refused_at_the_step() -> None:
    model = mlp()
    wrapped = wrap_model(model, "hooks", loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        expected_batch_size=2,
        loss_reduction="sum",
    )
    a, b, _ = batches()
    wrapped(a).sum().backward()
    opt.step()
    wrapped(b).sum().backward()  # the clipped pass is still held: a list of a marked and a new tensor
    marks = [hasattr(g, "_processed") for g in model[0].weight.grad_sample]
    assert marks == [True, False]
    with pytest.raises(ValueError, match=r"already clipped by a step.*optimizer.zero_grad\(\)"):
        opt.step()


def test_accumulated_iterations_refuses_parameters_reached_by_different_passes() -> None:
    model = mlp()
    wrapped = wrap_model(model, "hooks", loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=2
    )
    wrapped(batches()[0]).sum().backward()
    model[2].weight.grad_sample = None
    wrapped(batches()[1]).sum().backward()
    with pytest.raises(ValueError, match=r"inconsistent across parameters: \[1, 2\]"):
        _ = opt.accumulated_iterations


def test_the_flat_accessors_and_their_errors() -> None:
    model = mlp()
    wrap_model(model, "hooks", loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=2
    )
    p = model[0].weight
    with pytest.raises(ValueError, match=r"Per sample gradient not found.*wrap the model"):
        opt._get_flat_grad_sample(p)  # no backward pass yet
    p.grad_sample = None
    with pytest.raises(ValueError, match=r"p.grad_sample is None"):
        opt._get_flat_grad_sample(p)
    p.grad_sample = [torch.ones(2, 4, 3), torch.zeros(1, 4, 3)]
    assert opt._get_flat_grad_sample(p).sum().item() == 24.0
    p.grad_sample = []
    with pytest.raises(GradSampleError, match=r"empty list.*set p.grad_sample to None"):
        grad_sample_rows(p)
    p.grad_sample = "rows"
    with pytest.raises(TypeError, match=r"p.grad_sample is str.*Fix: set p.grad_sample to a \[B, \*p.shape\] tensor"):
        grad_sample_parts(p)


def test_a_grad_sample_replaced_by_hand_between_backward_passes_is_refused() -> None:
    model = mlp()
    wrapped = wrap_model(model, "hooks", loss_reduction="sum")
    wrapped(batches()[0]).sum().backward()
    model[0].weight.grad_sample = torch.zeros(3, 4, 3)  # 3 rows where the wrapper left 2
    with pytest.raises(GradSampleError, match=r"holds \[3\] rows.*replaced by hand.*Fix: call zero_grad\(\)"):
        wrapped(batches()[1]).sum().backward()


def test_ew_refuses_a_second_backward_through_one_forward_when_several_passes_are_held() -> None:
    model = mlp()
    wrapped = wrap_model(model, "ew", loss_reduction="sum")
    a, b, _ = batches()
    wrapped(a).sum().backward()
    loss = wrapped(b).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(GradSampleError, match=r"second backward pass through the same forward pass.*Fix: add"):
        loss.backward()


def test_forbidden_accumulation_still_refuses_the_second_pass() -> None:
    model = mlp()
    wrapped = wrap_model(model, "hooks", loss_reduction="sum")
    wrapped.forbid_grad_accumulation()
    wrapped(batches()[0]).sum().backward()
    with pytest.raises(GradSampleError, match=r"accumulation is forbidden.*zero_grad\(\)"):
        wrapped(batches()[1]).sum().backward()


@pytest.mark.parametrize("mode", [*LIST_MODES, "ghost"])
@pytest.mark.parametrize("record", ["scale_1e4", "duplicated", "cancelling_copies"])
def test_the_sensitivity_bound_holds_over_two_backward_passes(mode: str, record: str) -> None:
    """The auditor's DP step on a batch fed in two backward passes (the list form) on adversarial records."""
    case = audit_case("mlp", record)
    one = case.loss(loss_reduction="sum", batch_first=True, K=2)

    def two_backward_passes(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, t = batch
        cut = (x.shape[0] // 4) * 2  # on a sample boundary (K = 2 rows per sample)
        one(model, (x[:cut], t[:cut])).backward()
        return one(model, (x[cut:], t[cut:]))

    report = audit_sensitivity(
        case.model(True),
        batch=lambda idx: case.batch(idx, K=2, batch_first=True),
        loss=two_backward_passes,
        num_samples=case.num_samples,
        mode=mode,
        K=2,
        loss_reduction="sum",
        max_grad_norm=0.01,
    )
    assert report.ok(), report.table()
    assert report.max_ratio <= 1.0 + 1e-5
    assert report.reference_gap < 1e-4


def test_the_ghost_optimizer_counts_one_iteration_as_opacus_ghost_clipping_does() -> None:
    """Its scaling must not depend on which layers the hooks engine happens to hold lists for."""
    from dpnotebook.privacy._optimizer import GhostDPOptimizer

    model = nn.Sequential(nn.Linear(3, 4), Gain(), nn.Linear(4, 2))
    wrapped = wrap_model(model, "ghost", loss_reduction="sum")
    wrapped.allow_grad_accumulation()
    opt = GhostDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=2
    )
    for x in batches()[:2]:
        wrapped(x).pow(2).sum().backward()
    assert len(grad_sample_parts(model[1].gain)) == 2
    assert opt.accumulated_iterations == 1


def test_a_list_set_by_hand_in_no_op_mode_is_clipped_row_by_row() -> None:
    """``no_op``: the user sets ``p.grad_sample``; a list (Opacus' form) is read like the engine's."""
    model = nn.Linear(3, 1, bias=False)
    wrapped = wrap_model(model, "no_op", loss_reduction="sum")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        expected_batch_size=3,
        loss_reduction="sum",
    )
    wrapped(torch.randn(3, 3)).sum().backward()
    model.weight.grad_sample = [torch.tensor([[[3.0, 0, 0]]]), torch.tensor([[[0, 0.5, 0]], [[0, 0, 4.0]]])]
    opt.add_noise()
    torch.testing.assert_close(model.weight.grad, torch.tensor([[1.0, 0.5, 1.0]]))  # each row clipped to norm <= 1
