"""The hooks engine against models built to make it count wrong (issue #17, items 2, 3, 8, 9, 10).

Each test either checks the per-sample gradients against the float64 oracle,
or checks that the real DP step moves by at most C when one sample is removed
(sigma = 0), or checks that the library refuses with an error naming the fix.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_sequence

from dpnotebook import GradSampleError, GradSampleModule, wrap_model
from dpnotebook.grad_sample import GhostGradSampleModule
from dpnotebook.grad_sample._engine.calls import count_rows
from dpnotebook.grad_sample._engine.hooks import plan_units
from dpnotebook.privacy._optimizer import DPOptimizer
from dpnotebook.testing import reference_grad_samples

C = 0.1


def clipped_sum(wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """What one DP-SGD step adds before noise (sigma = 0): the clipped per-sample gradients, summed."""
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = DPOptimizer(
        torch.optim.SGD(params, lr=0), noise_multiplier=0, max_grad_norm=C, expected_batch_size=1, loss_reduction="sum"
    )
    opt.zero_grad()
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    opt.add_noise()
    out = [p.grad.detach().clone() for p in params]
    opt.zero_grad()
    return out


def sensitivity(wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor, s: int, batch_dim: int = 0) -> float:
    """``||S(D) - S(D without sample s)|| / C`` with the real DP optimizer."""
    keep = [i for i in range(x.shape[batch_dim]) if i != s]
    full = clipped_sum(wrapped, x, y)
    less = clipped_sum(wrapped, x.index_select(batch_dim, torch.tensor(keep)), y[keep])
    return torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(full, less, strict=True))).item() / C


# -- count_rows ----------------------------------------------------------------------------------
def test_count_rows_skips_flags_and_ints_and_reads_dicts_and_packed_sequences() -> None:
    ids = torch.zeros(6, 9, dtype=torch.long)
    assert (
        count_rows((torch.tensor(1.0), 3, "s"), {"batch": {"input_ids": ids, "mask": ids[:2]}}, batch_first=True) == 6
    )
    assert count_rows((), {"input_ids": ids}, batch_first=False) == 9
    assert count_rows((torch.zeros(4),), {}, batch_first=False) is None
    assert count_rows((None, 2), {}, batch_first=True) is None
    with torch.device("cpu"):  # its lengths: PyTorch wants them on the CPU, whatever the data's device
        packed = pack_sequence([torch.zeros(3, 2), torch.zeros(2, 2), torch.zeros(1, 2)])
    assert count_rows(([packed],), {}, batch_first=True) == 3


# -- item 3: rows clipped != examples sampled -----------------------------------------------------
class TimeMajorInside(nn.Module):
    """Takes [B, T] ids and runs time-major inside: every layer sees T rows, none sees B."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.emb(idx.t()))).mean(0)


@pytest.mark.parametrize("wrapper", [GradSampleModule, GhostGradSampleModule])
def test_layers_that_see_time_steps_instead_of_samples_are_refused(wrapper: type) -> None:
    torch.manual_seed(0)
    wrapped = wrapper(TimeMajorInside(), loss_reduction="sum")
    x, y = torch.randint(0, 10, (13, 7)), torch.randint(0, 3, (13,))
    with pytest.raises(
        GradSampleError,
        match=r"model.emb \(Embedding\) sees 7 rows in dim 0 but the model's input "
        r"carries 13 rows in dim 0 \(batch_first=True, K=1\).*use batch_first=False",
    ):
        sensitivity(wrapped, x, y, s=0)


def test_the_time_major_model_fed_time_major_keeps_its_bound() -> None:
    class TimeMajor(TimeMajorInside):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # [T, B] in, [B, classes] out
            return self.fc(torch.tanh(self.emb(idx))).mean(0)

    torch.manual_seed(0)
    wrapped = GradSampleModule(TimeMajor(), loss_reduction="sum", batch_first=False)
    x, y = torch.randint(0, 10, (7, 13)), torch.randint(0, 3, (13,))
    assert max(sensitivity(wrapped, x, y, s, batch_dim=1) for s in range(3)) <= 1 + 1e-5


def test_rows_are_checked_against_a_keyword_and_dict_input() -> None:
    class DictModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, flag: torch.Tensor, batch: dict) -> torch.Tensor:
            return self.fc(batch["x"][:2])  # keeps 2 rows of 5: those are not samples

    wrapped = GradSampleModule(DictModel())
    with pytest.raises(GradSampleError, match="sees 2 rows in dim 0 but the model's input carries 5 rows"):
        wrapped(torch.tensor(True), batch={"x": torch.randn(5, 4)})


def test_k_that_does_not_divide_the_rows_is_still_named() -> None:
    with pytest.raises(ValueError, match="model has 5 rows in dim 0, which K=2 does not divide"):
        GradSampleModule(nn.Linear(3, 2), K=2)(torch.randn(5, 3))


# -- item 9: one module reachable from two parents --------------------------------------------------
class TwoParents(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.a = nn.Sequential(shared, nn.Tanh())
        self.b = nn.Sequential(shared, nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_a_module_reachable_from_two_parents_is_one_unit_and_matches_the_oracle() -> None:
    torch.manual_seed(0)
    model = TwoParents().double()
    assert [p for p, _, _ in plan_units(model)] == ["model.a.0", "model.b.1"]
    x = torch.randn(5, 4, dtype=torch.float64)
    wrapped = GradSampleModule(model, loss_reduction="sum")
    target = torch.randn(5, 3, dtype=torch.float64)
    expected = reference_grad_samples(model, [x], target=target)
    (wrapped(x) * target).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, expected[name])


def test_a_module_shared_into_a_torch_func_unit_is_refused() -> None:
    shared = nn.Linear(4, 4)
    fallback = nn.Sequential(shared, nn.PReLU())  # Sequential has no parameters of its own: make one that has
    fallback.register_parameter("scale", nn.Parameter(torch.ones(1)))
    model = nn.Sequential(shared, fallback)
    with pytest.raises(GradSampleError, match=r"model.1.0 is also reachable as model.0, outside model.1"):
        plan_units(model)


# -- item 10: calling the inner module instead of the wrapper -----------------------------------------
@pytest.mark.parametrize("mode", ["hooks", "ew"])
def test_calling_the_inner_model_is_refused_and_the_wrapper_still_works(mode: str) -> None:
    """ew: before, the inner model ran with gradients; its gradient reached p.grad alone, and the DP step (which
    reads p.grad_sample) dropped it without a word; a DDP object called after make_private did the same."""
    model = nn.Sequential(nn.Linear(3, 2))
    wrapped = wrap_model(model, mode, loss_reduction="sum")
    for call in (wrapped._module, model):
        with pytest.raises(
            GradSampleError,
            match=rf"model.0 \(Linear\) ran with gradients enabled outside the "
            rf"{type(wrapped).__name__}'s forward.*Call the wrapper, model\(x\)",
        ):
            call(torch.randn(4, 3))
    with torch.no_grad():
        model(torch.randn(4, 3))
    wrapped(torch.randn(4, 3)).sum().backward()
    assert model[0].weight.grad_sample.shape == (4, 2, 3)
    plain = wrapped.to_standard_module()
    plain(torch.randn(4, 3)).sum().backward()
    assert not hasattr(plain[0].weight, "grad_sample") and not model[0]._forward_pre_hooks


def test_calling_the_inner_model_is_refused_in_ghost_mode() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    GhostGradSampleModule(model, loss_reduction="sum")
    with pytest.raises(GradSampleError, match="outside the GhostGradSampleModule's forward"):
        model(torch.randn(4, 3))


# -- item 2: rows in forward order --------------------------------------------------------------------
def test_two_forward_passes_before_one_backward_give_rows_in_forward_order() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    x1, x2 = torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    t = torch.randn(6, 2, dtype=torch.float64)
    expected = reference_grad_samples(model, [torch.cat([x1, x2])], target=t)
    wrapped = GradSampleModule(model, loss_reduction="sum")
    wrapped.allow_grad_accumulation()
    out1, out2 = wrapped(x1), wrapped(x2)
    ((out2 * t[2:]).sum() + (out1 * t[:2]).sum()).backward()  # backward reaches pass 2 first
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, expected[name])
        assert wrapped._store.blocks(p) == [(1, 2), (2, 4)]


def test_the_store_sorts_blocks_by_forward_pass_whatever_order_they_arrive_in() -> None:
    a, b = nn.Linear(2, 1), nn.Linear(2, 1)
    wrapped = GradSampleModule(nn.Sequential(a, b))
    wrapped._store._queue_check = lambda: None  # called here outside a backward pass
    g = {fid: torch.full((n, 1, 2), float(fid)) for fid, n in [(1, 2), (2, 3), (3, 1)]}
    for p, order in ((a.weight, [3, 1, 2, 1]), (b.weight, [2, 1, 3])):
        for fid in order:
            wrapped._store.add(p, g[fid], fid)
        assert wrapped._store.blocks(p) == [(1, 2), (2, 3), (3, 1)]
    assert a.weight.grad_sample[:, 0, 0].tolist() == [2, 2, 2, 2, 2, 3]
    assert b.weight.grad_sample[:, 0, 0].tolist() == [1, 1, 2, 2, 2, 3]
    wrapped.zero_grad()
    assert wrapped._store.blocks(a.weight) == []


# -- item 8: a parameter used inside and outside its layer ---------------------------------------------
class UsedOutside(nn.Module):
    """``fc`` is called, and its weight is used again by the parent: the second part has no sampler."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.fc(x)) + F.linear(x, self.fc.weight))


@pytest.mark.parametrize(
    "wrapper, message",
    [
        (
            GradSampleModule,
            r"parameter 'fc.weight' is used in the forward pass outside the layer that holds it.*"
            r"Call the layer itself \(self.fc\(x\)\)",
        ),
        (GhostGradSampleModule, r"received .grad but no grad_sample: \['fc.weight'\]"),  # ghost's own check
    ],
)
def test_a_parameter_used_outside_its_layer_is_refused(wrapper: type, message: str) -> None:
    torch.manual_seed(0)
    wrapped = wrapper(UsedOutside(), loss_reduction="sum")
    x, y = torch.randn(9, 4) * 10, torch.randint(0, 3, (9,))
    with pytest.raises(GradSampleError, match=message):
        sensitivity(wrapped, x, y, s=0)


def test_a_parameter_used_outside_is_refused_even_when_the_outside_parts_cancel() -> None:
    class Cancelling(UsedOutside):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # the outside part's gradient sums to 0 over the batch
            sign = torch.tensor([1.0, -1.0]).repeat(x.shape[0] // 2)[:, None]
            return self.head(self.fc(x)) + sign * F.linear(x, self.fc.weight).sum(1, keepdim=True)

    wrapped = GradSampleModule(Cancelling(), loss_reduction="sum")
    x = torch.randn(1, 4).repeat(4, 1)
    with pytest.raises(GradSampleError, match="parameter 'fc.weight' is used in the forward pass outside"):
        wrapped(x)


def test_tied_weights_and_shared_layer_parameters_still_match_the_oracle() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.mid = nn.Linear(4, 4)
            self.out = nn.Linear(4, 7, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.out(torch.tanh(self.mid(self.emb(idx)))).mean(1)

    torch.manual_seed(0)
    model = Tied().double()
    x, target = torch.randint(0, 7, (5, 3)), torch.randn(5, 7, dtype=torch.float64)
    expected = reference_grad_samples(model, [x], target=target)
    wrapped = GradSampleModule(model, loss_reduction="sum")
    (wrapped(x) * target).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, expected[name])
    assert all(isinstance(p, nn.Parameter) for m in model.modules() for p in m._parameters.values() if p is not None)
