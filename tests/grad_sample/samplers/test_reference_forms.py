"""Each sampler's reference form (the formula a student reads) and its fast form, against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpnotebook.grad_sample._contracts import affine_grads, affine_reference_grads
from dpnotebook.grad_sample.fast import buffers
from dpnotebook.grad_sample.fast.conv import _methods, conv_per_sample_grads
from dpnotebook.grad_sample.fast.linear import linear_weight_grads_into_buffer
from dpnotebook.grad_sample.samplers.conv_ops import conv_weight_grad_grouped, conv_weight_grad_per_sample
from dpnotebook.grad_sample.samplers.embedding import embedding_grad_sampler, embedding_weight_grads
from dpnotebook.grad_sample.samplers.embedding_bag import embedding_bag_grad_sampler, embedding_bag_weight_grads
from dpnotebook.grad_sample.samplers.group_norm import group_norm_grad_sampler
from dpnotebook.grad_sample.samplers.instance_norm import instance_norm_grad_sampler
from dpnotebook.grad_sample.samplers.layer_norm import layer_norm_grad_sampler
from dpnotebook.grad_sample.samplers.linear import linear_grad_sampler, linear_weight_grads
from dpnotebook.grad_sample.samplers.rms_norm import rms_norm_grad_sampler
from dpnotebook.testing import Split, random_target, reference_grad_samples

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


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same shape and values (the oracle is float64; so are these forms here)."""
    return got.shape == want.shape and torch.allclose(got, want, atol=TOL)


def nonzero(oracle: torch.Tensor) -> bool:
    """Whether a comparison with ``oracle`` can fail for all-zero output (an empty batch cannot)."""
    return oracle.numel() == 0 or oracle.abs().max().item() > 0.1


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("B", [0, 2])
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("positions", [(), (4,), (2, 3)])
def test_embedding_reference_and_fast_forms_match_the_oracle(
    positions: tuple, padding_idx: int | None, B: int, K: int
) -> None:
    layer = nn.Embedding(6, 3, padding_idx=padding_idx).double()
    idx = torch.randint(0, 6, (B * K, *positions))
    if idx.numel() >= 3:
        idx.view(-1)[:2] = 4  # a repeated index within sample 0 (the same row, or two of its copies)
        idx.view(-1)[2] = 2  # the padding row, where there is one
    g = random_target(layer, [idx])
    oracle = reference_grad_samples(layer, [idx], target=g, K=K)["weight"]
    reference = embedding_weight_grads(idx, g, 6, K, padding_idx)
    fast = embedding_grad_sampler(layer, [idx], g, K)[layer.weight]
    assert nonzero(oracle) and close(reference, oracle) and close(fast, oracle) and close(fast, reference)
    if padding_idx is not None:
        assert torch.equal(fast[:, padding_idx], torch.zeros(B, 3, dtype=torch.float64))


def test_embedding_fast_form_through_a_reused_buffer_matches_the_reference() -> None:
    layer = nn.Embedding(512, 64).double()  # [4, 512, 64] float64: 1 MiB, the size that goes through a buffer
    results = []
    for seed in range(2):
        idx = torch.randint(0, 512, (4, 5), generator=torch.Generator().manual_seed(seed))
        g = random_target(layer, [idx], seed=seed)
        fast = embedding_grad_sampler(layer, [idx], g, 1)[layer.weight]
        results.append(fast.data_ptr())
        assert close(fast, embedding_weight_grads(idx, g, 512, 1))  # the reused buffer starts from zero again
        del fast
    if buffers.CAN_COUNT_STORAGE_USERS:
        assert results[0] == results[1]  # the second call did reuse the first one's memory


def test_a_frozen_embedding_has_no_grad_sample() -> None:
    layer = nn.Embedding(5, 2).double().requires_grad_(False)
    idx = torch.tensor([[1, 2], [3, 3]])
    assert embedding_grad_sampler(layer, [idx], torch.randn(2, 2, 2, dtype=torch.float64), 1) == {}


def bag_inputs(layout: str, n: int, use_psw: bool, padding_idx: int | None) -> tuple:
    """``(indices, offsets, per_sample_weights)`` for ``n`` bags, with an empty bag, repeats and padding."""
    if layout == "2d":
        idx = torch.randint(0, 4, (n, 4))
    else:
        lengths = torch.tensor([r % 4 for r in range(n)], dtype=torch.long)  # bag 0 is empty
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        idx = torch.randint(0, 4, (int(lengths.sum()),))
    if idx.numel() >= 4:
        idx.view(-1)[-3:-1] = 3  # a repeated index in the last bag
        idx.view(-1)[-1] = 1 if padding_idx is None else padding_idx
    psw = torch.randn(idx.shape, dtype=torch.float64) if use_psw else None
    if layout == "2d":
        return idx, None, psw
    return idx, offsets if layout == "offsets_last" else offsets[:-1], psw


def bag_split(offsets: torch.Tensor | None, include_last: bool) -> Split | None:
    """Row ``r`` of a 1-D EmbeddingBag input alone: its indices, offsets ``[0]`` and weights."""
    if offsets is None:
        return None

    def split(inputs: tuple, r: int) -> tuple:
        idx, _, psw = inputs
        ends = offsets[1:] if include_last else torch.cat([offsets[1:], torch.tensor([idx.numel()])])
        lo, hi = int(offsets[r]), int(ends[r])
        return idx[lo:hi], torch.tensor([0, hi - lo] if include_last else [0]), None if psw is None else psw[lo:hi]

    return split


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("B", [0, 2])
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("layout", ["2d", "offsets", "offsets_last"])
@pytest.mark.parametrize("mode,use_psw", [("sum", False), ("sum", True), ("mean", False)])
def test_embedding_bag_reference_form_and_sampler_match_the_oracle(
    mode: str, use_psw: bool, layout: str, padding_idx: int | None, B: int, K: int
) -> None:
    layer = nn.EmbeddingBag(5, 3, mode=mode, padding_idx=padding_idx, include_last_offset=layout == "offsets_last")
    layer = layer.double()
    inputs = bag_inputs(layout, B * K, use_psw, padding_idx)
    g = random_target(layer, inputs)
    split = bag_split(inputs[1], layout == "offsets_last")
    oracle = reference_grad_samples(layer, inputs, target=g, K=K, split=split)["weight"]
    reference = embedding_bag_weight_grads(layer, *inputs, g, K)
    registered = embedding_bag_grad_sampler(layer, list(inputs), g, K)[layer.weight]
    assert nonzero(oracle) and close(reference, oracle) and close(registered, oracle) and close(registered, reference)


def test_a_frozen_embedding_bag_has_no_grad_sample() -> None:
    layer = nn.EmbeddingBag(5, 2).double().requires_grad_(False)
    assert embedding_bag_grad_sampler(layer, [torch.tensor([[1, 2]]), None, None], torch.ones(1, 2), 1) == {}


def normalise(x: torch.Tensor, dims: tuple[int, ...], eps: float, centre: bool = True) -> torch.Tensor:
    """``x`` normalised over ``dims``: ``(x - mean) / sqrt(var + eps)``, or ``x / rms`` (``centre=False``)."""
    if not centre:
        return x / (x.pow(2).mean(dims, keepdim=True) + eps).sqrt()
    centred = x - x.mean(dims, keepdim=True)
    return centred / (centred.pow(2).mean(dims, keepdim=True) + eps).sqrt()


def group_normalise(x: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    per_group = math.prod(x.shape[1:]) // groups  # not -1: an empty batch reshapes too
    return normalise(x.reshape(x.shape[0], groups, per_group), (2,), eps).reshape(x.shape)


NORM_CASES = {  # layer, input shape after the rows, dims the parameters span, x_hat written out
    "layer_norm_one_dim": (lambda: nn.LayerNorm(4), (3, 4), (-1,), lambda x: normalise(x, (-1,), 1e-5)),
    "layer_norm_no_positions": (lambda: nn.LayerNorm(4), (4,), (-1,), lambda x: normalise(x, (-1,), 1e-5)),
    "layer_norm_two_dims": (lambda: nn.LayerNorm((3, 4)), (2, 3, 4), (-2, -1), lambda x: normalise(x, (-2, -1), 1e-5)),
    "group_norm": (lambda: nn.GroupNorm(2, 4), (4, 3, 3), (1,), lambda x: group_normalise(x, 2, 1e-5)),
    "group_norm_one_position_dim": (lambda: nn.GroupNorm(2, 4), (4, 5), (1,), lambda x: group_normalise(x, 2, 1e-5)),
    "group_norm_no_positions": (lambda: nn.GroupNorm(2, 4), (4,), (1,), lambda x: group_normalise(x, 2, 1e-5)),
    "instance_norm_2d": (
        lambda: nn.InstanceNorm2d(3, affine=True),
        (3, 4, 4),
        (1,),
        lambda x: normalise(x, (2, 3), 1e-5),
    ),
    "rms_norm": (
        lambda: nn.RMSNorm((3, 4), eps=1e-6),
        (2, 3, 4),
        (-2, -1),
        lambda x: normalise(x, (-2, -1), 1e-6, centre=False),
    ),
}
NORM_SAMPLERS = {
    nn.LayerNorm: layer_norm_grad_sampler,
    nn.GroupNorm: group_norm_grad_sampler,
    nn.InstanceNorm2d: instance_norm_grad_sampler,
    nn.RMSNorm: rms_norm_grad_sampler,
}


#: every case with B = 0 and B = 2 samples, but InstanceNorm: PyTorch's own instance_norm cannot run on an empty batch
NORM_CASE_BATCHES = [(case, B) for case in NORM_CASES for B in (0, 2) if B or "instance_norm" not in case]


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize(("case", "B"), NORM_CASE_BATCHES)
def test_norm_affine_reference_and_fast_forms_match_the_oracle(case: str, B: int, frozen: bool, K: int) -> None:
    make, shape, param_dims, plain_x_hat = NORM_CASES[case]
    layer = make().double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    if frozen:  # the bias, or the weight of a layer without one (RMSNorm): then nothing is left
        (layer.bias if getattr(layer, "bias", None) is not None else layer.weight).requires_grad_(False)
    x = torch.randn(B * K, *shape, dtype=torch.float64)
    g = random_target(layer, [x])
    fast = NORM_SAMPLERS[type(layer)](layer, [x], g, K)
    if not any(p.requires_grad for p in layer.parameters()):
        assert fast == {}  # (and the oracle has nothing to differentiate)
        return
    oracle = reference_grad_samples(layer, [x], target=g, K=K)
    x_hat, g_before = plain_x_hat(x), g.clone()
    x_hat_before = x_hat.clone()
    weight_ref, bias_ref = affine_reference_grads(x_hat, g, K, param_dims)
    assert torch.equal(x_hat, x_hat_before) and torch.equal(g, g_before)  # the reference form changes nothing
    reference = {"weight": weight_ref, "bias": bias_ref}
    names = {p: n for n, p in layer.named_parameters()}
    assert sorted(names[p] for p in fast) == sorted(oracle)  # frozen parameters left out, by both
    for name, want in oracle.items():
        assert nonzero(want)
        assert close(reference[name], want), name
        assert close(fast[layer.get_parameter(name)], want), name
        assert close(fast[layer.get_parameter(name)], reference[name]), name
