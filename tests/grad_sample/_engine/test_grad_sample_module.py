"""GradSampleModule on whole models, and everything around the samplers.

Composite models are compared with the float64 oracle under a real loss
(cross-entropy), in every mode that supports them and for K in {1, 2, 4}.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpnotebook
from dpnotebook import GradSampleError, GradSampleModule, UnsupportedModuleError, register_grad_sampler
from dpnotebook.benchmarks.models import SampleConvNet
from dpnotebook.grad_sample import unregister_grad_sampler
from dpnotebook.testing import reference_grad_samples


class TinyTransformerBlock(nn.Module):
    """Embedding + LayerNorm + a per-sample self-attention made of Linear layers + mean pooling."""

    def __init__(self, vocab: int = 11, d: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(tokens))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
        return self.head((h + self.ff(h)).mean(1))


class TiedLM(nn.Module):
    """Embedding whose weight is reused by the output layer (weight tying)."""

    def __init__(self, vocab: int = 9, d: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens)))).mean(1)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


MODELS = {
    "SampleConvNet": (SampleConvNet, lambda n: torch.randn(n, 1, 28, 28), 10),
    "MLP": (mlp, lambda n: torch.randn(n, 6), 4),
    "TransformerBlock": (TinyTransformerBlock, lambda n: torch.randint(0, 11, (n, 5)), 3),
    "TiedLM": (TiedLM, lambda n: torch.randint(0, 9, (n, 4)), 9),
}


def ce_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew"])
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_composite_models_match_oracle(name: str, mode: str, K: int, reduction: str) -> None:
    build, make_input, classes = MODELS[name]
    model = build().to(torch.float64)
    B = 3
    x, y = make_input(B * K), torch.randint(0, classes, (B * K,))
    x = x.double() if x.is_floating_point() else x
    ref = reference_grad_samples(model, [x], target=y, loss_fn=ce_sum, K=K)
    plain = copy.deepcopy(model)
    F.cross_entropy(plain(x), y, reduction=reduction).backward()
    wrapped = dpnotebook.wrap_model(model, mode, K=K, loss_reduction=reduction)
    F.cross_entropy(wrapped(x), y, reduction=reduction).backward()
    for (n, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert p.grad_sample.shape == (B, *p.shape)
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)
        if mode == "ew":  # rebuilt from per-row gradients: equal up to roundoff
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-14)
        elif p.grad.device.type == "cpu":
            assert torch.equal(p.grad, q.grad), "p.grad must stay what plain PyTorch computes"
        else:  # CUDA's float64 convolution gradients are not deterministic: two plain runs differ at 1e-16
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-14)


def test_memory_free_k_average_is_the_mean_of_copies() -> None:
    """K identical copies of a sample give that sample's own K=1 gradient."""
    model = mlp().double()
    x = torch.randn(3, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (3,))
    g1 = GradSampleModule(copy.deepcopy(model))
    F.cross_entropy(g1(x), y).backward()
    g4 = GradSampleModule(copy.deepcopy(model), K=4)
    F.cross_entropy(g4(x.repeat_interleave(4, 0)), y.repeat_interleave(4)).backward()
    for p1, p4 in zip(g1.parameters(), g4.parameters(), strict=True):
        torch.testing.assert_close(p1.grad_sample, p4.grad_sample)


def test_layer_called_twice_adds_contributions() -> None:
    lin = nn.Linear(3, 3).double()

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.tanh(self.lin(x)))

    model = Twice()
    x = torch.randn(4, 3, dtype=torch.float64)
    ref = reference_grad_samples(model, [x], target=torch.ones(4, 3, dtype=torch.float64), K=2)
    GradSampleModule(model, K=2, loss_reduction="sum")(x).sum().backward()
    torch.testing.assert_close(lin.weight.grad_sample, ref["lin.weight"], rtol=1e-10, atol=0)


def test_frozen_parameters_get_no_grad_sample_and_unfreezing_later_works() -> None:
    model = mlp()
    model[0].requires_grad_(False)
    wrapped = GradSampleModule(model)
    wrapped(torch.randn(5, 6)).sum().backward()
    assert model[0].weight.grad_sample is None if hasattr(model[0].weight, "grad_sample") else True
    assert model[2].weight.grad_sample.shape == (5, 16, 16)
    model[0].requires_grad_(True)
    wrapped.zero_grad()
    wrapped(torch.randn(5, 6)).sum().backward()
    assert model[0].weight.grad_sample.shape == (5, 16, 6)


def test_batch_first_false_sequence_model() -> None:
    model = nn.Sequential(nn.Embedding(7, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double()
    tokens = torch.randint(0, 7, (5, 6))  # [T, B*K]
    ref = reference_grad_samples(model, [tokens], K=3, batch_first=False)
    target = torch.randn(5, 6, 2, dtype=torch.float64)
    ref = reference_grad_samples(model, [tokens], target=target, K=3, batch_first=False)
    GradSampleModule(model, K=3, batch_first=False, loss_reduction="sum")(tokens).mul(target).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_empty_batch(mode: str) -> None:
    model = mlp()
    wrapped = dpnotebook.wrap_model(model, mode, K=2)
    wrapped(torch.randn(0, 6)).sum().backward()
    for p in model.parameters():
        assert p.grad_sample.shape == (0, *p.shape)


def test_second_backward_appends_samples_unless_forbidden() -> None:
    model = mlp()
    wrapped = GradSampleModule(model)
    wrapped(torch.randn(3, 6)).sum().backward()
    first = model[0].weight.grad_sample.clone()
    wrapped(torch.randn(2, 6)).sum().backward()
    parts = model[0].weight.grad_sample  # one tensor per backward pass, as in Opacus
    assert isinstance(parts, list) and [g.shape[0] for g in parts] == [3, 2]
    assert torch.equal(parts[0], first)
    wrapped.zero_grad()
    assert model[0].weight.grad_sample is None and model[0].weight.grad is None
    wrapped.forbid_grad_accumulation()
    wrapped(torch.randn(3, 6)).sum().backward()
    with pytest.raises(GradSampleError, match=r"accumulation is forbidden.*zero_grad\(\)"):
        wrapped(torch.randn(3, 6)).sum().backward()
    wrapped.zero_grad()
    wrapped(torch.randn(3, 6)).sum().backward()  # usable again
    assert model[0].weight.grad_sample.shape[0] == 3


def test_to_standard_module_returns_the_original_untouched() -> None:
    model = mlp()
    wrapped = GradSampleModule(model)
    assert getattr(wrapped, "0") is model[0]  # attributes fall through to the wrapped module
    wrapped(torch.randn(2, 6)).sum().backward()
    back = wrapped.to_standard_module()
    assert back is model
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    for p in model.parameters():
        assert not hasattr(p, "grad_sample")
        assert not p._post_accumulate_grad_hooks
    model(torch.randn(2, 6)).sum().backward()  # plain PyTorch again, no error
    assert not hasattr(model[0].weight, "grad_sample")


def test_disable_hooks_gives_plain_pytorch() -> None:
    model = mlp()
    wrapped = GradSampleModule(model)
    wrapped.disable_hooks()
    wrapped(torch.randn(2, 6)).sum().backward()
    assert model[0].weight.grad is not None and not hasattr(model[0].weight, "grad_sample")
    wrapped.enable_hooks()
    wrapped.zero_grad()
    wrapped(torch.randn(2, 6)).sum().backward()
    assert model[0].weight.grad_sample.shape == (2, 16, 6)


def test_remove_and_add_hooks() -> None:
    model = mlp()
    wrapped = GradSampleModule(model)
    wrapped.remove_hooks()
    assert all(not m._forward_hooks for m in model.modules())
    wrapped.add_hooks()
    wrapped(torch.randn(2, 6)).sum().backward()
    assert model[4].bias.grad_sample.shape == (2, 4)


# -- bad input ---------------------------------------------------------------


def test_strict_wrap_lists_every_sample_mixing_layer_and_leaves_model_unchanged() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)))
    with pytest.raises(UnsupportedModuleError) as info:
        GradSampleModule(model)
    msg = str(info.value)
    assert "model.1 (BatchNorm2d)" in msg and "model.2.1 (BatchNorm2d)" in msg and "GroupNorm" in msg
    assert [p.path for p in info.value.problems] == ["model.1", "model.2.1"]
    assert all(not m._forward_hooks for m in model.modules())
    assert not GradSampleModule.is_supported(model)
    assert len(GradSampleModule.validate(model)) == 2
    model(torch.randn(2, 1, 8, 8)).sum().backward()  # still a working model


@pytest.mark.parametrize("K", [0, -1, 1.5, "2", True])
def test_bad_k(K: object) -> None:
    with pytest.raises(ValueError, match=rf"K={K!r} is invalid.*int >= 1"):
        GradSampleModule(nn.Linear(2, 2), K=K)


def test_rows_not_divisible_by_k_and_model_usable_after() -> None:
    wrapped = GradSampleModule(nn.Linear(2, 2), K=3)
    with pytest.raises(ValueError, match=r"has 4 rows in dim 0, which K=3 does not divide"):
        wrapped(torch.randn(4, 2))
    wrapped(torch.randn(6, 2)).sum().backward()
    assert wrapped.weight.grad_sample.shape == (2, 2, 2)


def test_bad_loss_reduction() -> None:
    with pytest.raises(ValueError, match=r"loss_reduction='avg' is invalid.*'mean'.*'sum'"):
        GradSampleModule(nn.Linear(2, 2), loss_reduction="avg")


def test_batch_first_contradicting_the_input_is_detected() -> None:
    wrapped = GradSampleModule(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), batch_first=False)
    with pytest.raises(GradSampleError, match=r"batch_first=False says \(use batch_first=True"):
        wrapped(torch.randn(5, 3))
    with pytest.raises(GradSampleError, match=r"has no batch dim 1 \(batch_first=False\)"):
        GradSampleModule(nn.Linear(3, 4), batch_first=False)(torch.randn(3))


def test_parameter_used_outside_its_module_is_an_error() -> None:
    class Sneaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.out = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(F.linear(x, self.fc.weight, self.fc.bias))  # bypasses fc's hooks

    wrapped = GradSampleModule(Sneaky())
    with pytest.raises(GradSampleError, match=r"received \.grad but no grad_sample: \['fc.weight', 'fc.bias'\]"):
        wrapped(torch.randn(4, 3)).sum().backward()


def test_bare_parameter_in_a_parent_meets_the_batch_as_a_broadcast() -> None:
    """Held by the container that also holds a sampled layer: captured where it meets the batch (issue #30)."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.scale = nn.Parameter(torch.tensor([2.0, 0.5]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * self.scale

    model = Scaled().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    ref = reference_grad_samples(model, [x], K=2)
    wrapped = GradSampleModule(model, K=2, loss_reduction="sum")
    target = torch.randn(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (wrapped(x) * target).sum().backward()
    assert wrapped.units == [("model.fc", "linear_grad_sampler"), ("model.scale", "broadcast")]
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)


def test_dropout_inside_a_fallback_unit_is_refused_clearly() -> None:
    class WithDropout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x * self.w, 0.5, self.training)

    wrapped = GradSampleModule(WithDropout())
    with pytest.raises(
        GradSampleError, match=r"(?s)model \(WithDropout\) has no registered grad sampler.*random numbers.*nn.Dropout"
    ):
        wrapped(torch.randn(4, 3)).sum().backward()


# -- custom samplers ---------------------------------------------------------


class Scale(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def test_opacus_style_three_argument_sampler_is_averaged_over_k() -> None:
    @register_grad_sampler(Scale)
    def per_row(layer: Scale, activations: list, backprops: torch.Tensor) -> dict:
        return {layer.w: activations[0] * backprops}

    try:
        model = Scale(3).double()
        x = torch.randn(6, 3, dtype=torch.float64)
        ref = reference_grad_samples(model, [x], K=3)
        wrapped = GradSampleModule(model, K=3, loss_reduction="sum")
        assert wrapped.units == [("model", "per_row")]
        target = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        (wrapped(x) * target).sum().backward()
        torch.testing.assert_close(model.w.grad_sample, ref["w"], rtol=1e-10, atol=0)
    finally:
        unregister_grad_sampler(Scale)


def test_sampler_with_wrong_shape_is_reported() -> None:
    @register_grad_sampler(Scale)
    def wrong(layer: Scale, activations: list, backprops: torch.Tensor, K: int) -> dict:
        return {layer.w: (activations[0] * backprops)}  # forgot to average over K

    try:
        wrapped = GradSampleModule(Scale(3), K=2)
        with pytest.raises(GradSampleError, match=r"'wrong' .* returned shape \(4, 3\) for 'w'; expected .* \(2, 3\)"):
            wrapped(torch.randn(4, 3)).sum().backward()
    finally:
        unregister_grad_sampler(Scale)


def test_sampler_returning_a_foreign_parameter_is_reported() -> None:
    stranger = nn.Parameter(torch.zeros(3))

    @register_grad_sampler(Scale)
    def foreign(layer: Scale, activations: list, backprops: torch.Tensor, K: int) -> dict:
        return {stranger: torch.zeros(activations[0].shape[0] // K, 3)}

    try:
        wrapped = GradSampleModule(Scale(3))
        with pytest.raises(GradSampleError, match=r"'foreign' .* not one of Scale's own \(\['w'\]\)"):
            wrapped(torch.randn(4, 3)).sum().backward()
    finally:
        unregister_grad_sampler(Scale)


def test_register_rejects_non_module_types() -> None:
    with pytest.raises(TypeError, match=r"got 'Linear' \(a str\).*register_grad_sampler\(nn.Linear\)"):
        register_grad_sampler("Linear")


def test_wrapping_a_model_twice_is_refused_and_copies_drop_stale_hooks() -> None:
    from dpnotebook.testing import check_grad_sampler, clean_copy

    model = mlp()
    first = GradSampleModule(model)
    with pytest.raises(ValueError, match=r"model.0 already has hooks of another GradSampleModule.*to_standard_module"):
        GradSampleModule(model)
    copied = clean_copy(model)  # a wrapped model's copy carries no hooks, so it can be wrapped
    assert all(not m._forward_hooks for m in copied.modules())
    GradSampleModule(copied)(torch.randn(2, 6)).sum().backward()
    assert copied[0].weight.grad_sample.shape == (2, 16, 6)
    assert check_grad_sampler(model, torch.randn(4, 6), K=2).ok  # checks a clean copy
    first.to_standard_module()
    GradSampleModule(model)  # free again


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
def test_a_second_wrapper_is_refused_in_every_hooking_mode_and_leaves_no_hook(mode: str) -> None:
    """Ghost's taps were not recognised (the second wrap was accepted, then failed at forward time with a
    misleading error); functorch's refused wrap left its batch-moving forward hook on the model."""
    from dpnotebook.modes import wrap_model
    from dpnotebook.testing import clean_copy

    model = mlp()
    first = wrap_model(model, mode)
    with pytest.raises(ValueError, match=r"already has hooks of another .*to_standard_module"):
        wrap_model(model, mode, batch_first=False)
    copied = clean_copy(model)  # ghost's pre-forward hooks, left on a copy, detached its parameters
    copied(torch.randn(2, 6)).sum().backward()
    assert all(p.grad is not None for p in copied.parameters())
    first.to_standard_module()
    assert all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in model.modules())
    assert not any(vars(p).get("_dpn_ghost_owner") for p in model.parameters())


def test_a_position_table_looked_up_with_arange_is_a_broadcast() -> None:
    """Refused until issue #30 (its 5 rows are not the 3 samples'); now its per-row cotangents are captured."""

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(9, 4)
            self.positions = nn.Embedding(5, 4)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.embed(tokens) + self.positions(torch.arange(tokens.shape[1]))

    model = Positions().double()
    tokens = torch.randint(0, 9, (3, 5), generator=torch.Generator().manual_seed(0))
    target = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = reference_grad_samples(model, [tokens], target=target)
    wrapped = GradSampleModule(model, loss_reduction="sum")
    (wrapped(tokens) * target).sum().backward()
    assert ("model.positions.weight", "broadcast") in wrapped.units
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-10, atol=1e-12)


def test_activations_are_let_go_once_a_layers_per_sample_gradients_are_taken(monkeypatch) -> None:
    """Autograd frees each saved input as backward goes; hooks mode must not keep them all to the end."""
    import weakref

    from dpnotebook.grad_sample._engine import layer_hooks as hooks

    seen: list[weakref.ref] = []
    original = hooks.sampler_grad_samples

    def spy(entry, call, backprops, K, scale):
        seen.append(weakref.ref(call.args[0]))
        return original(entry, call, backprops, K, scale)

    monkeypatch.setattr(hooks, "sampler_grad_samples", spy)
    model = GradSampleModule(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    loss = model(torch.randn(5, 3)).sum()
    loss.backward(retain_graph=True)  # the graph, and the hooks on it, stay alive
    assert len(seen) == 2 and all(ref() is None for ref in seen)
    with pytest.raises(GradSampleError, match="retain_graph=True"):
        loss.backward()


def test_cached_forward_signature_matches_inspect_and_follows_instance_overrides() -> None:
    import inspect

    from dpnotebook.grad_sample._engine.layer_hooks import bound_arguments, forward_signature

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, scale: float = 2.0, *, shift: float = 0.0) -> torch.Tensor:
            return x * scale + shift

    class Static(nn.Module):
        @staticmethod
        def forward(x: torch.Tensor, y: int = 1) -> torch.Tensor:
            return x

    patched = Scaled()
    patched.forward = lambda a, b=5: a  # an instance attribute wins over the class's forward
    for module in (Scaled(), Static(), nn.EmbeddingBag(3, 2), patched):
        assert forward_signature(module) == inspect.signature(module.forward)
    assert bound_arguments(Scaled(), ("x",), {"shift": 1.0}) == ["x", 2.0, 1.0]
    assert bound_arguments(patched, ("x",), {}) == ["x", 5]
