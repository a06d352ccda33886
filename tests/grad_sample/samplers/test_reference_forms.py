"""Each sampler's reference form (the formula a student reads) and its fast form, against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpnotebook.grad_sample import _registry as registry
from dpnotebook.grad_sample.samplers import _contracts, buffers, conv, linear_norm
from dpnotebook.grad_sample.samplers._contracts import affine_grads, affine_reference_grads
from dpnotebook.grad_sample.samplers.conv import conv_method, conv_per_sample_grads, conv_weight_grads
from dpnotebook.grad_sample.samplers.embedding import embedding_grad_sampler_fast, embedding_weight_grads
from dpnotebook.grad_sample.samplers.embedding_bag import embedding_bag_grad_sampler, embedding_bag_weight_grads
from dpnotebook.grad_sample.samplers.linear import linear_weight_grads
from dpnotebook.grad_sample.samplers.norms import (
    group_norm_grad_sampler,
    instance_norm_grad_sampler,
    layer_norm_grad_sampler,
    rms_norm_grad_sampler,
)
from dpnotebook.testing import Split, random_target, reference_grad_samples

TOL = 1e-10


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("leading", [(), (4,), (2, 3)])
def test_linear_formula_matches_the_oracle(K: int, leading: tuple) -> None:
    layer = nn.Linear(5, 3).double()
    x = torch.randn(2 * K, *leading, 5, dtype=torch.float64)
    g = random_target(layer, [x])
    oracle = reference_grad_samples(layer, [x], target=g, K=K)["weight"]
    assert torch.allclose(linear_weight_grads(x, g, K), oracle, atol=TOL)


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize(
    "layer,shape",
    [
        (nn.Conv1d(2, 3, 3, padding=1, stride=2), (2, 9)),
        (nn.Conv2d(2, 4, 3, stride=2, padding=1), (2, 7, 7)),
        (nn.Conv2d(4, 4, 3, groups=2, dilation=2, padding="same"), (4, 8, 8)),
        (nn.Conv2d(2, 3, 2, padding=1, padding_mode="reflect"), (2, 5, 5)),
        (nn.Conv2d(2, 3, 2, padding=1, padding_mode="circular", dilation=2), (2, 6, 6)),
        (nn.Conv2d(1, 4, 8, stride=2, padding=3), (1, 12, 12)),
        (nn.Conv3d(2, 2, 2, stride=(1, 2, 1)), (2, 3, 4, 4)),
    ],
)
def test_conv_formula_and_every_method_match_the_oracle(layer: nn.Module, shape: tuple, K: int) -> None:
    layer = layer.double()
    x = torch.randn(3 * K, *shape, dtype=torch.float64)
    g = random_target(layer, [x])
    oracle = reference_grad_samples(layer, [x], target=g, K=K)["weight"]
    assert torch.allclose(conv_weight_grads(layer, x, g, K), oracle, atol=TOL)
    for method in ("unfold", "grouped") if layer.groups == 1 else ("grouped",):
        out = torch.full((3, *layer.weight.shape), float("nan"), dtype=torch.float64)
        assert torch.allclose(conv_per_sample_grads(layer, x, g, K, out, method) / K, oracle, atol=TOL), method


def test_im2col_patches_go_through_a_reused_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """One sample per chunk, both chunks through one buffer that starts full of NaN."""
    monkeypatch.setattr(conv, "CHUNK_BYTES", 1)
    monkeypatch.setattr(conv, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(_contracts, "ACCELERATOR_SCRATCH_BYTES", 1)  # the same one-sample chunks on a GPU
    layer, K = nn.Conv2d(2, 3, 3, stride=2, padding=1).double(), 2
    x = torch.randn(2 * K, 2, 7, 7, dtype=torch.float64)
    g = random_target(layer, [x])
    ref = reference_grad_samples(layer, [x], target=g, K=K)["weight"] * K
    asked: list[tuple] = []

    def workspace(shape: tuple) -> torch.Tensor:
        asked.append(shape)
        return torch.full(shape, float("nan"), dtype=torch.float64)

    got = conv_per_sample_grads(layer, x, g, K, torch.empty_like(ref), "unfold", workspace=workspace)
    assert asked == [(1, 2, 3, 3, K, 4, 4)]
    assert torch.allclose(got, ref, rtol=TOL, atol=TOL)


def test_the_cpu_conv_rule_does_not_decide_another_device() -> None:
    """The "meta" device stands in for a GPU: shapes only, no data, and not the CPU."""
    meta = torch.device("meta")
    cases = [  # layer, input, output, the CPU's choice, a GPU's
        (nn.Conv1d(16, 32, 3, padding=1), (4, 16, 128), (4, 32, 128), "grouped", "unfold"),
        (nn.Conv2d(256, 256, 3, padding=1), (4, 256, 14, 14), (4, 256, 14, 14), "unfold", "grouped"),
        # 128 -> 128 on 8x8: 73,728 numbers per row, below the GPU's crossover (im2col 1.3-1.9x faster on an H100)
        (nn.Conv2d(128, 128, 3, padding=1), (4, 128, 8, 8), (4, 128, 8, 8), "unfold", "unfold"),
        (nn.Conv2d(4, 4, 3, groups=2), (4, 4, 5, 5), (4, 4, 3, 3), "grouped", "grouped"),
    ]
    for layer, x, g, cpu, gpu in cases:
        assert conv_method(layer, torch.empty(x, device="cpu"), torch.empty(g, device="cpu"), K=1) == cpu, layer
        assert conv_method(layer, torch.empty(x, device=meta), torch.empty(g, device=meta), K=1) == gpu, layer


def test_scratch_budgets_are_the_cpus_only_on_the_cpu() -> None:
    budget = max(conv.CHUNK_BYTES, linear_norm.CHUNK_BYTES)
    cpu = torch.device("cpu")  # named: under --device cuda a bare torch.empty is on the GPU
    assert _contracts.scratch_bytes(budget, torch.empty(1, device=cpu)) == budget
    assert (
        _contracts.scratch_bytes(budget, torch.empty(1, device="meta")) == _contracts.ACCELERATOR_SCRATCH_BYTES > budget
    )
    per_sample = 2**20  # 4 MiB of float32 scratch per sample
    assert linear_norm._chunk(512, per_sample, torch.empty(1, device=cpu)) == 8
    assert linear_norm._chunk(512, per_sample, torch.empty(1, device="meta")) == 64


def test_affine_grads_leaves_its_input_alone_unless_told() -> None:
    ln = nn.LayerNorm(3).double()
    x_hat, g = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    before = x_hat.clone()
    kept = affine_grads(ln, x_hat, g, K=2, channels_dim1=False)
    assert torch.equal(x_hat, before)
    scratch = affine_grads(ln, x_hat.clone(), g, K=2, channels_dim1=False, overwrite_x_hat=True)
    assert all(torch.equal(kept[p], scratch[p]) for p in kept)


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
    fast = embedding_grad_sampler_fast(layer, [idx], g, K)[layer.weight]
    assert nonzero(oracle) and close(reference, oracle) and close(fast, oracle) and close(fast, reference)
    if padding_idx is not None:
        assert torch.equal(fast[:, padding_idx], torch.zeros(B, 3, dtype=torch.float64))


def test_a_frozen_embedding_has_no_grad_sample() -> None:
    layer = nn.Embedding(5, 2).double().requires_grad_(False)
    idx = torch.tensor([[1, 2], [3, 3]])
    assert embedding_grad_sampler_fast(layer, [idx], torch.randn(2, 2, 2, dtype=torch.float64), 1) == {}


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


@pytest.mark.parametrize("can_count", [True, False])
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_opt_in_buffer_reuse_gives_the_formula_and_never_overwrites_a_kept_result(
    kind: str, can_count: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_SAMPLERS", dict(registry._SAMPLERS))  # restored after the test
    monkeypatch.setattr(buffers, "CAN_COUNT_STORAGE_USERS", can_count and buffers.CAN_COUNT_STORAGE_USERS)
    buffers.reuse_result_buffers()
    if kind == "linear":  # results of [4, 512, 512] or [4, 8, 4, 7, 7] float64: over MIN_BYTES, through a buffer
        layer, x = nn.Linear(512, 512).double(), torch.randn(4, 512, dtype=torch.float64)
    else:
        layer, x = nn.Conv2d(4, 512, 7).double(), torch.randn(4, 4, 9, 9, dtype=torch.float64)
    entry = registry.find_grad_sampler(layer)
    assert entry is not None and entry.fast is not None
    g = random_target(layer, [x])
    formula = entry.fn(layer, [x], g, 1)[layer.weight]
    kept = entry.form([x], g)(layer, [x], g, 1)[layer.weight]
    copy = kept.clone()
    second = entry.form([x], 2 * g)(layer, [x], 2 * g, 1)[layer.weight]
    assert torch.equal(kept, copy) and second.data_ptr() != kept.data_ptr()  # kept: never written again
    assert torch.allclose(kept, formula, atol=TOL) and torch.allclose(second, 2 * formula, atol=TOL)
    ptr = second.data_ptr()
    del second  # released: the next result may go into its memory
    third = entry.form([x], g)(layer, [x], g, 1)[layer.weight]
    assert (third.data_ptr() == ptr) == buffers.CAN_COUNT_STORAGE_USERS
    assert torch.allclose(third, formula, atol=TOL)
