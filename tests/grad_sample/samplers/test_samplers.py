"""Every built-in grad sampler against the float64 microbatching oracle.

Shapes, K, reductions, batch_first and frozen parameters are drawn by
hypothesis; empty (N=0) and single-sample batches are included. Each case runs
through ``check_grad_sampler``, which compares both the registered sampler and
the torch.func fallback with the oracle and raises on any mismatch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpnotebook import GradSampleModule
from dpnotebook.testing import check_grad_sampler

CASES = settings(max_examples=12, deadline=None, derandomize=True)
B_ = st.integers(0, 3)
K_ = st.sampled_from([1, 2, 4])
REDUCTION_ = st.sampled_from(["mean", "sum"])
DTYPES = [(torch.float64, 1e-10), (torch.float32, 1e-5)]


def freeze_some(draw: st.DrawFn, layer: nn.Module) -> nn.Module:
    """Freeze a random subset of the layer's parameters (never all of them)."""
    params = list(layer.parameters())
    if len(params) > 1:
        frozen = draw(st.sampled_from([None] + list(range(len(params)))))
        if frozen is not None:
            params[frozen].requires_grad_(False)
    return layer


def run_case(layer: nn.Module, inputs: tuple, K: int, reduction: str, batch_first: bool = True, split=None) -> None:
    fallback = split is None  # torch.func cannot split flattened bag inputs row by row
    for dtype, tol in DTYPES:
        report = check_grad_sampler(
            layer,
            *inputs,
            K=K,
            batch_first=batch_first,
            loss_reduction=reduction,
            dtype=dtype,
            tolerance=tol,
            split=split,
            fallback=fallback,
        )
        assert report.rows, "nothing was compared"
        assert report.ok
    wrapped = GradSampleModule(layer.to(torch.float64), K=K, batch_first=batch_first, loss_reduction=reduction)
    out = wrapped(*[x.to(torch.float64) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs])
    out.sum().backward()
    for p in layer.parameters():
        assert (getattr(p, "grad_sample", None) is None) == (not p.requires_grad)
    wrapped.to_standard_module()


@CASES
@given(st.data())
def test_linear(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    batch_first = data.draw(st.booleans())
    extra = data.draw(st.lists(st.integers(1, 3), min_size=0 if batch_first else 1, max_size=2))
    d_in, d_out = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    layer = nn.Linear(d_in, d_out, bias=data.draw(st.booleans()))
    freeze_some(data.draw, layer)
    shape = [B * K, *extra, d_in] if batch_first else [extra[0], B * K, *extra[1:], d_in]
    run_case(layer, (torch.randn(shape),), K, red, batch_first)


@CASES
@given(st.data())
def test_conv(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    dims = data.draw(st.sampled_from([1, 2, 3]))
    groups = data.draw(st.sampled_from([1, 2]))
    c_in = groups * data.draw(st.integers(1, 2))
    c_out = groups * data.draw(st.integers(1, 2))
    if data.draw(st.booleans()):  # depthwise
        c_in, groups = c_out, c_out
    stride = data.draw(st.integers(1, 2))
    padding = data.draw(st.sampled_from([0, 1, "valid"] + (["same"] if stride == 1 else [])))
    mode = data.draw(st.sampled_from(["zeros", "reflect", "circular", "replicate"])) if padding == 1 else "zeros"
    kernel = data.draw(st.integers(1, 3 if dims < 3 else 2))
    dilation = data.draw(st.integers(1, 2))
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    layer = conv(
        c_in,
        c_out,
        kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=data.draw(st.booleans()),
        padding_mode=mode,
    )
    freeze_some(data.draw, layer)
    size = 5 if dims < 3 else 4
    run_case(layer, (torch.randn(B * K, c_in, *[size] * dims),), K, red)


@CASES
@given(st.data())
def test_embedding(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    V, D = data.draw(st.integers(2, 8)), data.draw(st.integers(1, 4))
    padding_idx = data.draw(st.one_of(st.none(), st.integers(0, V - 1)))
    batch_first = data.draw(st.booleans())
    T = data.draw(st.integers(1, 4))
    layer = nn.Embedding(V, D, padding_idx=padding_idx)
    shape = (B * K, T) if batch_first else (T, B * K)
    idx = torch.randint(0, V, shape)
    if padding_idx is not None and idx.numel():
        idx.view(-1)[0] = padding_idx  # make sure the padding row is looked up
    run_case(layer, (idx,), K, red, batch_first)


def test_embedding_padding_row_is_zero() -> None:
    layer = nn.Embedding(5, 3, padding_idx=1)
    wrapped = GradSampleModule(layer, K=2)
    wrapped(torch.tensor([[1, 2], [1, 1], [3, 1], [4, 1]])).sum().backward()
    assert torch.equal(layer.weight.grad_sample[:, 1], torch.zeros(2, 3))
    assert torch.equal(layer.weight.grad[1], torch.zeros(3))
    assert layer.weight.grad_sample[:, 2].abs().sum() > 0


def bag_split(offsets: torch.Tensor, include_last: bool, psw: torch.Tensor | None):
    """Row r of a 1-D EmbeddingBag input: its own indices, offsets [0] and weights."""

    def split(inputs: tuple, r: int) -> tuple:
        idx = inputs[0]
        ends = offsets[1:] if include_last else torch.cat([offsets[1:], torch.tensor([idx.numel()])])
        lo, hi = int(offsets[r]), int(ends[r])
        off = torch.tensor([0, hi - lo]) if include_last else torch.tensor([0])
        w = psw[lo:hi] if psw is not None else None
        return (idx[lo:hi], off, w)

    return split


@CASES
@given(st.data())
def test_embedding_bag(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    V, D = data.draw(st.integers(2, 8)), data.draw(st.integers(1, 4))
    mode = data.draw(st.sampled_from(["sum", "mean"]))
    padding_idx = data.draw(st.one_of(st.none(), st.integers(0, V - 1)))
    layout = data.draw(st.sampled_from(["2d", "offsets", "offsets_last"]))
    use_psw = mode == "sum" and data.draw(st.booleans())
    layer = nn.EmbeddingBag(V, D, mode=mode, padding_idx=padding_idx, include_last_offset=layout == "offsets_last")
    n = B * K
    if layout == "2d":
        L = data.draw(st.integers(1, 4))
        idx = torch.randint(0, V, (n, L))
        psw = torch.randn(n, L, dtype=torch.float64) if use_psw else None
        run_case(layer, (idx, None, psw), K, red)
        return
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    if layout == "offsets":
        offsets = offsets[:-1]
    idx = torch.randint(0, V, (int(lengths.sum()),))
    psw = torch.randn(idx.numel(), dtype=torch.float64) if use_psw else None
    run_case(layer, (idx, offsets, psw), K, red, split=bag_split(offsets, layout == "offsets_last", psw))


@CASES
@given(st.data())
def test_layer_norm_and_rms_norm(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    batch_first = data.draw(st.booleans())
    normalized = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    lead = data.draw(st.lists(st.integers(1, 3), min_size=0 if batch_first else 1, max_size=1))
    if data.draw(st.booleans()):
        layer = nn.LayerNorm(normalized, elementwise_affine=True, bias=data.draw(st.booleans()))
    else:
        # eps=None means "machine epsilon of the dtype": float32 and float64 models would differ
        layer = nn.RMSNorm(normalized, eps=data.draw(st.sampled_from([1e-6, 1e-5])))
    freeze_some(data.draw, layer)
    shape = [B * K, *lead, *normalized] if batch_first else [lead[0], B * K, *normalized]
    run_case(layer, (torch.randn(shape),), K, red, batch_first)


@CASES
@given(st.data())
def test_group_norm_and_instance_norm(data: st.DataObject) -> None:
    B, K, red = data.draw(B_), data.draw(K_), data.draw(REDUCTION_)
    dims = data.draw(st.sampled_from([1, 2, 3]))
    if data.draw(st.booleans()):
        groups = data.draw(st.integers(1, 3))
        C = groups * data.draw(st.integers(1, 2))
        layer = nn.GroupNorm(groups, C)
        spatial = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    else:
        B = max(B, 1)  # PyTorch's own instance_norm cannot run on an empty batch
        C = data.draw(st.integers(1, 3))
        layer = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[dims](C, affine=True)
        spatial = [data.draw(st.integers(2, 3)) for _ in range(dims)]
    freeze_some(data.draw, layer)
    run_case(layer, (torch.randn(B * K, C, *spatial),), K, red)


def test_embedding_bag_max_mode_is_refused_clearly() -> None:
    wrapped = GradSampleModule(nn.EmbeddingBag(5, 2, mode="max"))
    with pytest.raises(NotImplementedError, match="mode='max'.*mode='sum' or mode='mean'"):
        wrapped(torch.randint(0, 5, (2, 3))).sum().backward()
