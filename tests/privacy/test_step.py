"""The DP step's invariants (dpnotebook.privacy._step), each with the error it raises.

1. a step moves exactly what it clipped and noised (issue #28.1: a parameter frozen between backward and step);
2. one DP optimizer per model (#28.2: make_private twice on one model);
3. a logical step's constants are fixed (#28.3: a clipping scheduler inside BatchMemoryManager);
4. what a step clipped is never clipped again: a step without zero_grad is refused (#33.2).
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnotebook import PrivacyEngine, wrap_model
from dpnotebook.grad_sample._engine.hooks import wrapper_hooking
from dpnotebook.privacy import (
    BatchMemoryManager,
    DPOptimizer,
    ExponentialGradClip,
    ExponentialNoise,
    StepGradClip,
    StepNoise,
)
from dpnotebook.privacy._optimizer import optimizer_class

MODES = ["hooks", "functorch", "ew", "ghost"]


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def batch(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def dp(model: nn.Module, mode: str = "hooks", *, params=None, **kwargs) -> DPOptimizer:
    options = dict(noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=8, secure_mode=False) | kwargs
    sgd = torch.optim.SGD(list(params if params is not None else model.parameters()), lr=0.5)
    return optimizer_class(mode)(sgd, **options)


def private(model: nn.Module, *, engine: PrivacyEngine | None = None, params=None, mode="hooks", **kwargs):
    x, y = batch(32)
    engine = engine or PrivacyEngine(secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(list(params if params is not None else model.parameters()), lr=0.5),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
            noise_multiplier=kwargs.pop("noise_multiplier", 1.0),
            max_grad_norm=kwargs.pop("max_grad_norm", 1.0),
            grad_sample_mode=mode,
            **kwargs,
        )


# -- 1. a step moves exactly what it clipped and noised ------------------------------------------------------
@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew"])
def test_a_parameter_frozen_between_backward_and_step_is_refused_by_name(mode: str) -> None:
    """On main (3c3f8c6) SGD applied the frozen weight's raw .grad: one sample moved the step by 105 C."""
    model = tiny_model()
    wrapped = wrap_model(model, mode)
    opt = dp(model, mode)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch()
    F.cross_entropy(wrapped(x), y).backward()
    model[0].weight.requires_grad_(False)
    with pytest.raises(RuntimeError, match=r"requires_grad=False but holds a \.grad.*Fix: freeze parameters before"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))  # nothing moved


def test_the_frozen_parameter_is_named_by_its_path() -> None:
    model = tiny_model()
    wrapped = wrap_model(model, "hooks")
    opt = dp(model)
    x, y = batch()
    F.cross_entropy(wrapped(x), y).backward()
    model[2].bias.requires_grad_(False)
    with pytest.raises(RuntimeError, match=r"parameter '2\.bias'"):
        opt.step()


@pytest.mark.parametrize("mode", MODES)
def test_frozen_before_the_pass_or_zeroed_after_freezing_steps(mode: str) -> None:
    """Freezing as fine-tuning does it is untouched: the frozen weight has no .grad, or a .grad of zeros."""
    model = tiny_model()
    wrapped = wrap_model(model, mode)
    opt = dp(model, mode)
    x, y = batch()
    model[0].weight.requires_grad_(False)
    F.cross_entropy(wrapped(x), y).backward()
    frozen = model[0].weight.detach().clone()
    opt.step()
    assert torch.equal(model[0].weight, frozen)
    opt.zero_grad(set_to_none=False)
    model[0].bias.grad = torch.zeros_like(model[0].bias)  # zeros carry no data
    model[0].bias.requires_grad_(False)
    F.cross_entropy(wrapped(x), y).backward()
    opt.step()


# -- 2. one DP optimizer per model ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_make_private_twice_on_one_model_is_refused(mode: str) -> None:
    """On main: two optimizers over the two halves moved the step by sqrt(2) C and the accountant counted 2 steps."""
    model = tiny_model()
    engine = PrivacyEngine(secure_mode=False)
    wrapped, first, loader = private(model, engine=engine, params=model[0].parameters(), mode=mode)
    with pytest.raises(RuntimeError, match=r"already has a DP optimizer.*one DP optimizer over all the parameters"):
        private(wrapped, engine=engine, params=model[2].parameters(), mode=mode)
    x, y = next(iter(loader))  # a batch the DP loader drew for this step
    first.zero_grad()
    F.cross_entropy(wrapped(x), y).backward()
    first.step()
    assert len(engine.accountant) == 1  # the refused second optimizer counted nothing


def test_a_dp_optimizer_over_parameters_another_owns_is_refused() -> None:
    model = tiny_model()
    wrap_model(model, "hooks")
    first = dp(model)
    with pytest.raises(
        RuntimeError, match=r"already has a DP optimizer \(DPOptimizer over 4 parameter\(s\)\): a second make_private"
    ):
        dp(model, params=model[2].parameters())
    assert first.params


def test_a_dropped_optimizer_a_fresh_model_and_separate_models_are_free() -> None:
    model = tiny_model()
    wrapped, opt, _ = private(model)
    del opt
    gc.collect()
    _, second, _ = private(wrapped)  # the first optimizer is gone: the model may have a new one
    a, b = tiny_model(), tiny_model()
    private(a), private(b)  # two models, one optimizer each
    unwrapped = wrapped.to_standard_module()
    with pytest.raises(RuntimeError, match="already has a DP optimizer"):
        dp(unwrapped)  # the live second optimizer still owns the parameters
    with pytest.raises(RuntimeError, match="already has a DP optimizer"):
        private(unwrapped)
    assert wrapper_hooking(unwrapped) is None  # refused before any hook was added
    del second
    private(unwrapped)  # now free


# -- 3. a logical step's constants are fixed -----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_clipping_scheduler_inside_a_logical_batch_is_refused(mode: str) -> None:
    """On main: pieces clipped at C, 0.5 C, 0.25 C and noise calibrated to 0.125 C (8 C in the surface audit)."""
    model = tiny_model()
    wrapped, opt, loader = private(model, mode=mode, poisson_sampling=False, loss_reduction="sum")
    scheduler = ExponentialGradClip(opt, gamma=0.5)
    with pytest.raises(RuntimeError, match=r"max_grad_norm changed while a logical batch is accumulated: 1\.0 .* 0\.5"):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=2, optimizer=opt) as batches:
            for x, y in batches:
                opt.zero_grad()
                F.cross_entropy(wrapped(x), y, reduction="sum").backward()
                opt.step()
                scheduler.step()


@pytest.mark.parametrize(
    "name,value",
    [("noise_multiplier", 2.0), ("max_grad_norm", 0.5), ("expected_batch_size", 16.0)],
)
def test_every_constant_is_fixed_between_virtual_steps(name: str, value: float) -> None:
    model = tiny_model()
    wrapped = wrap_model(model, "hooks")
    opt = dp(model, noise_multiplier=1.0)
    x, y = batch()
    F.cross_entropy(wrapped(x[:4]), y[:4]).backward()
    opt.virtual_step()
    setattr(opt, name, value)
    F.cross_entropy(wrapped(x[4:]), y[4:]).backward()
    with pytest.raises(RuntimeError, match=f"{name} changed while a logical batch is accumulated"):
        opt.step()


def test_per_layer_bounds_are_fixed_too() -> None:
    model = tiny_model()
    wrapped = wrap_model(model, "hooks")
    opt = dp(model, max_grad_norm=[1.0] * 4, clipping="per_layer")
    x, y = batch()
    F.cross_entropy(wrapped(x[:4]), y[:4]).backward()
    opt.virtual_step()
    opt.max_grad_norm = [1.0, 1.0, 1.0, 0.5]
    F.cross_entropy(wrapped(x[4:]), y[4:]).backward()
    with pytest.raises(RuntimeError, match=r"max_grad_norms? changed"):
        opt.step()


def test_schedulers_between_logical_batches_take_effect() -> None:
    """Per epoch, under BatchMemoryManager: each logical batch is clipped and noised with one sigma and one C."""
    model = tiny_model()
    wrapped, opt, loader = private(model, poisson_sampling=False)
    clip, noise = StepGradClip(opt, step_size=1, gamma=0.5), StepNoise(opt, step_size=1, gamma=2.0)
    seen = []
    opt.attach_step_hook(lambda o: seen.append((o.last_step_stats.max_grad_norm, o.last_step_stats.noise_std)))
    for _ in range(2):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=3, optimizer=opt) as batches:
            for x, y in batches:
                opt.zero_grad()
                F.cross_entropy(wrapped(x), y).backward()
                opt.step()
        clip.step(), noise.step()
    assert seen == [(1.0, 1.0)] * 4 + [(0.5, 1.0)] * 4  # noise std = sigma * C: 2.0 * 0.5


def test_a_resumed_schedule_goes_on_from_the_sigma_it_reached(tmp_path) -> None:
    """load_checkpoint with the noise scheduler restores sigma: before, the run went on from make_private's."""
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, opt, _ = private(tiny_model(), engine=engine, noise_multiplier=4.0)
    noise = ExponentialNoise(opt, gamma=0.5)
    noise.step(), noise.step()
    engine.save_checkpoint(path=tmp_path / "run.pt", module=model, optimizer=opt, noise_scheduler=noise)
    fresh = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, opt, _ = private(tiny_model(), engine=fresh, noise_multiplier=4.0)
    noise = ExponentialNoise(opt, gamma=0.5)
    fresh.load_checkpoint(path=tmp_path / "run.pt", module=model, optimizer=opt, noise_scheduler=noise)
    assert opt.noise_multiplier == 1.0
    noise.step()
    assert opt.noise_multiplier == 0.5


def test_a_clipping_scheduler_keeps_per_layer_bounds_in_proportion() -> None:
    """Before, the scheduler replaced the bounds [1, 3] by their total (equal bounds C / sqrt(L))."""
    opt = dp(tiny_model(), max_grad_norm=[1.0, 3.0, 1.0, 3.0], clipping="per_layer")
    clip = ExponentialGradClip(opt, gamma=0.5)
    assert opt.max_grad_norms == [1.0, 3.0, 1.0, 3.0]
    clip.step()
    assert opt.max_grad_norms == [0.5, 1.5, 0.5, 1.5]
    assert opt.max_grad_norm == pytest.approx(5**0.5)


@pytest.mark.parametrize("mode", MODES)
def test_one_poisson_batch_in_two_backward_passes_is_averaged_over_the_batch(mode: str) -> None:
    """Before, hooks, functorch and ew divided by 2 * q * N (ghost did not): the update was halved."""
    updates = []
    for pieces in (1, 2):
        model, opt, loader = private(tiny_model(), mode=mode, noise_multiplier=0.0, max_grad_norm=100.0)
        x, y = next(iter(loader))
        opt.zero_grad()
        for part in torch.tensor_split(torch.arange(len(x)), pieces):
            F.cross_entropy(model(x[part]), y[part]).backward()
        opt.step()
        updates.append([p.grad.clone() for p in opt.params])
    for whole, split in zip(*updates, strict=True):
        torch.testing.assert_close(split, whole)


# -- 4. what a step clipped is never clipped again ------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_step_twice_without_zero_grad_names_the_cause(mode: str) -> None:
    """On main: 'wrap the model with make_private' (it was wrapped); the cause is a missing zero_grad."""
    model = tiny_model()
    wrapped = wrap_model(model, mode)
    opt = dp(model, mode)
    x, y = batch()
    F.cross_entropy(wrapped(x), y).backward()
    opt.step()
    with pytest.raises(
        ValueError, match=r"haven't been cleared since the last optimizer step.*Fix: call optimizer\.zero_grad"
    ):
        opt.step()


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_a_backward_without_zero_grad_after_a_step_is_refused(mode: str) -> None:
    """On main this passed silently; Opacus raises. The last step's rows must not be clipped again."""
    model = tiny_model()
    wrapped = wrap_model(model, mode)
    opt = dp(model, mode)
    x, y = batch()
    F.cross_entropy(wrapped(x), y).backward()
    opt.step()
    F.cross_entropy(wrapped(x), y).backward()
    with pytest.raises(ValueError, match="haven't been cleared since the last optimizer step"):
        opt.step()


@pytest.mark.parametrize("clear", ["optimizer", "optimizer_zeros", "model"])
def test_any_zero_grad_between_steps_is_enough(clear: str) -> None:
    model = tiny_model()
    wrapped = wrap_model(model, "hooks")
    opt = dp(model)
    x, y = batch()
    for _ in range(3):
        if clear == "optimizer":
            opt.zero_grad()
        elif clear == "optimizer_zeros":
            opt.zero_grad(set_to_none=False)
        else:
            wrapped.zero_grad()
        F.cross_entropy(wrapped(x), y).backward()
        opt.step()
    assert opt.last_step_stats.batch_size == 8


def test_what_clip_and_accumulate_clipped_is_not_clipped_again() -> None:
    model = tiny_model()
    wrapped = wrap_model(model, "hooks")
    opt = dp(model)
    x, y = batch()
    F.cross_entropy(wrapped(x), y).backward()
    opt.clip_and_accumulate()
    once = [p.summed_grad.clone() for p in opt.params]
    opt.clip_and_accumulate()  # nothing new since: a no-op (Opacus' pre_step order, then add_noise, relies on it)
    opt.virtual_step()
    assert all(torch.equal(p.summed_grad, s) for p, s in zip(opt.params, once, strict=True))
    F.cross_entropy(wrapped(x), y).backward()  # a new backward pass after a step's clipping: refused as before
    opt.step()
    with pytest.raises(ValueError, match="haven't been cleared"):
        F.cross_entropy(wrapped(x), y).backward()
        opt.step()


def test_a_deep_copy_or_a_pickle_of_a_claimed_model_carries_no_claim() -> None:
    import io

    from dpnotebook.testing import clean_copy

    model = tiny_model()
    wrapped, opt, _ = private(model)
    private(clean_copy(model))  # the copy's parameters are new ones: free
    torch.save(list(model.parameters()), io.BytesIO())  # no weak reference on the parameters
    assert opt.params
