"""Each sampler's reference form (the formula a student reads) and its fast form, against the float64 oracle."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook.grad_sample.samplers.conv_ops import conv_weight_grad_grouped, conv_weight_grad_per_sample
from dpnotebook.grad_sample.fast import buffers
from dpnotebook.grad_sample.fast.conv import _methods, conv_per_sample_grads
from dpnotebook.grad_sample.fast.linear import linear_weight_grads_into_buffer
from dpnotebook.grad_sample.samplers.linear import linear_grad_sampler, linear_weight_grads
from dpnotebook.grad_sample.samplers.sample_rows import affine_grads
from dpnotebook.testing import random_target, reference_grad_samples

TOL = 1e-10


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("leading", [(), (4,), (2, 3)])
def test_linear_reference_and_fast_forms_match_the_oracle(K: int, leading: tuple) -> None:
    layer = nn.Linear(5, 3).double()
    x = torch.randn(2 * K, *leading, 5, dtype=torch.float64)
    g = random_target(layer, [x])
    oracle = reference_grad_samples(layer, [x], target=g, K=K)["weight"]
    assert torch.allclose(linear_weight_grads(x, g, K), oracle, atol=TOL)
    assert torch.allclose(linear_weight_grads_into_buffer(layer, x, g, K), oracle, atol=TOL)


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize(
    "conv,shape",
    [
        (nn.Conv1d(2, 3, 3, padding=1), (2, 9)),
        (nn.Conv2d(2, 4, 3, stride=2, padding=1), (2, 7, 7)),
        (nn.Conv2d(4, 4, 3, groups=2, dilation=2, padding="same"), (4, 8, 8)),
        (nn.Conv2d(2, 3, 2, padding=1, padding_mode="reflect"), (2, 5, 5)),
        (nn.Conv3d(1, 2, 2), (1, 4, 4, 4)),
    ],
)
def test_conv_reference_and_every_fast_method_match_the_oracle(conv: nn.Module, shape: tuple, K: int) -> None:
    conv = conv.double()
    x = torch.randn(3 * K, *shape, dtype=torch.float64)
    g = random_target(conv, [x])
    oracle = reference_grad_samples(conv, [x], target=g, K=K)["weight"]
    assert torch.allclose(conv_weight_grad_per_sample(conv, x, g, K), oracle, atol=TOL)
    assert torch.allclose(conv_weight_grad_grouped(conv, x, g, K) / K, oracle, atol=TOL)
    for method in _methods(conv):
        out = torch.full((3, *conv.weight.shape), float("nan"), dtype=torch.float64)
        assert torch.allclose(conv_per_sample_grads(conv, x, g, K, out, method) / K, oracle, atol=TOL), method


def test_without_the_private_reference_count_no_buffer_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    layer, like, shape = nn.Linear(2, 2), torch.zeros(1), (64, 64, 64)
    a = buffers.result_buffer(layer, "weight", shape, like)
    a_id = id(a)
    del a
    monkeypatch.setattr(buffers, "CAN_COUNT_STORAGE_USERS", False)
    assert id(buffers.result_buffer(layer, "weight", shape, like)) != a_id  # the fallback: always a new tensor
    x = torch.randn(4, 512, dtype=torch.float64)  # a result of 2 MiB: would go through a buffer
    big = nn.Linear(512, 512).double()
    g = random_target(big, [x])
    first = linear_grad_sampler(big, [x], g, 1)[big.weight]
    second = linear_grad_sampler(big, [x], g, 1)[big.weight]
    assert first is not second and torch.equal(first, second)


def test_a_kept_result_is_never_overwritten() -> None:
    layer = nn.Linear(512, 512).double()
    x = torch.randn(4, 512, dtype=torch.float64)
    g = random_target(layer, [x])
    kept = linear_grad_sampler(layer, [x], g, 1)[layer.weight]
    copy = kept.clone()
    linear_grad_sampler(layer, [x * 2], g, 1)
    assert torch.equal(kept, copy)


def test_affine_grads_leaves_its_input_alone_unless_told() -> None:
    ln = nn.LayerNorm(3).double()
    x_hat, g = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    before = x_hat.clone()
    kept = affine_grads(ln, x_hat, g, K=2, channels_dim1=False)
    assert torch.equal(x_hat, before)
    scratch = affine_grads(ln, x_hat.clone(), g, K=2, channels_dim1=False, overwrite_x_hat=True)
    assert all(torch.equal(kept[p], scratch[p]) for p in kept)


@pytest.mark.parametrize("policy", ["timed", "unfold", "grouped", "vmap"])
def test_every_conv_policy_gives_the_oracle_and_shapes_is_the_default(policy: str) -> None:
    from dpnotebook.grad_sample.fast import conv as fast_conv

    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    x = torch.randn(4, 2, 6, 6, dtype=torch.float64)
    g = random_target(conv, [x])
    oracle = reference_grad_samples(conv, [x], target=g, K=2)["weight"]
    assert fast_conv._policy == "shapes"
    try:
        fast_conv.set_conv_method(policy)
        chosen = fast_conv.conv_method(conv, x, g, 2)
        assert chosen == policy if policy != "timed" else chosen in _methods(conv)
        out = torch.empty(2, *conv.weight.shape, dtype=torch.float64)
        assert torch.allclose(conv_per_sample_grads(conv, x, g, 2, out) / 2, oracle, atol=TOL)
    finally:
        fast_conv.set_conv_method("shapes")
