"""Clipping: the bound holds for any shapes, the per-layer split keeps the total, the sum is exact."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnotebook.privacy import (
    clip_and_sum,
    clip_factors,
    layer_thresholds,
    per_layer_norms,
    per_sample_norms,
)

shapes = st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=3), min_size=1, max_size=4)  # [] is a 0-d parameter


def make_grads(batch: int, param_shapes: list[list[int]], scale: float, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(batch, *shape, generator=gen) for shape in param_shapes]


def clipped_per_sample(grads: list[torch.Tensor], factors: torch.Tensor) -> list[torch.Tensor]:
    """Each sample's clipped gradient, in float64, from the factors ([B] or [L, B])."""
    if factors.dim() == 1:
        factors = factors.expand(len(grads), -1)
    return [g.double() * f.double().view(-1, *[1] * (g.dim() - 1)) for g, f in zip(grads, factors, strict=True)]


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 8),
    param_shapes=shapes,
    scale=st.floats(1e-3, 1e3),
    max_grad_norm=st.floats(1e-2, 10.0),
    seed=st.integers(0, 2**16),
)
def test_flat_clipping_bounds_every_sample(batch, param_shapes, scale, max_grad_norm, seed):
    grads = make_grads(batch, param_shapes, scale, seed)
    result = clip_and_sum(grads, max_grad_norm=max_grad_norm, clipping="flat")
    clipped = clipped_per_sample(grads, result.factors)
    norms = torch.stack([c.reshape(len(c), -1).pow(2).sum(1) for c in clipped]).sum(0).sqrt()
    assert (norms <= max_grad_norm * (1 + 1e-6)).all()


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 8),
    param_shapes=shapes,
    scale=st.floats(1e-3, 1e3),
    max_grad_norm=st.floats(1e-2, 10.0),
    seed=st.integers(0, 2**16),
)
def test_per_layer_split_keeps_each_layer_and_the_total_under_c(batch, param_shapes, scale, max_grad_norm, seed):
    grads = make_grads(batch, param_shapes, scale, seed)
    result = clip_and_sum(grads, max_grad_norm=max_grad_norm, clipping="per_layer")
    clipped = clipped_per_sample(grads, result.factors)
    layer = torch.stack([c.reshape(len(c), -1).norm(dim=1) for c in clipped])  # [L, B]
    assert (layer <= max_grad_norm / math.sqrt(len(grads)) * (1 + 1e-6)).all()
    assert (layer.norm(dim=0) <= max_grad_norm * (1 + 1e-6)).all()
    assert result.sensitivity == max_grad_norm


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_clipped_sum_equals_manual_float64(clipping):
    grads = make_grads(7, [[3, 4], [5], [2, 2, 2]], scale=2.0, seed=1)
    C = 1.5
    result = clip_and_sum(grads, max_grad_norm=C, clipping=clipping)
    expected = [torch.zeros(g.shape[1:], dtype=torch.float64) for g in grads]
    for i in range(7):
        sample = [g[i].double() for g in grads]
        if clipping == "flat":
            norm = math.sqrt(sum(float((s * s).sum()) for s in sample))
            factors = [min(1.0, C / (norm + 1e-6))] * len(sample)
        else:
            bound = C / math.sqrt(len(sample))
            factors = [min(1.0, bound / (float(s.norm()) + 1e-6)) for s in sample]
        for e, s, f in zip(expected, sample, factors, strict=True):
            e += f * s
    for got, want in zip(result.summed, expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_norms_factors_and_fraction():
    grads = [torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])]
    result = clip_and_sum(grads, max_grad_norm=1.0)
    torch.testing.assert_close(result.norms, torch.tensor([5.0, 0.5, 0.0]))
    torch.testing.assert_close(result.factors, torch.tensor([1 / (5 + 1e-6), 1.0, 1.0]))
    assert result.fraction_clipped == pytest.approx(1 / 3)
    assert result.batch_size == 3


def test_norm_helpers_agree():
    grads = make_grads(4, [[2, 3], [6]], scale=1.0, seed=0)
    flat = torch.cat([g.flatten(1) for g in grads], dim=1)
    torch.testing.assert_close(per_sample_norms(grads), flat.norm(dim=1))
    torch.testing.assert_close(per_layer_norms(grads)[1], grads[1].norm(dim=1))
    assert layer_thresholds(2.0, 4) == 1.0
    assert clip_factors(torch.tensor([1e9]), math.inf).item() == 1.0


def test_zero_dim_parameter():
    """A 0-d parameter's per-sample gradients have shape [B]: one entry each in the norms."""
    result = clip_and_sum([torch.full((2,), 3.0), torch.full((2, 1, 16), 1.0)], max_grad_norm=10.0)
    torch.testing.assert_close(result.norms, torch.tensor([5.0, 5.0]))
    assert result.summed[0].shape == () and result.summed[0].item() == 6.0
    assert per_layer_norms({"t": torch.zeros(0)}).shape == (1, 0)


def test_dict_input_and_empty_batch():
    result = clip_and_sum({"w": torch.zeros(0, 2, 3), "b": torch.zeros(0, 2)}, max_grad_norm=1.0)
    assert [s.shape for s in result.summed] == [torch.Size([2, 3]), torch.Size([2])]
    assert all((s == 0).all() for s in result.summed)
    assert result.fraction_clipped == 0.0 and result.batch_size == 0


def test_mismatched_batch_sizes_raise():
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        clip_and_sum([torch.zeros(2, 3), torch.zeros(3, 3)], max_grad_norm=1.0)


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_norm_gets_factor_zero_and_adds_nothing(clipping: str, bad: float) -> None:
    from dpnotebook.errors import PrivacyWarning

    g = [torch.randn(4, 3), torch.randn(4, 2, 2)]
    g[0][2, 1] = bad
    with pytest.warns(PrivacyWarning, match=r"1 sample\(s\) of 4 have a NaN or infinite gradient norm"):
        result = clip_and_sum(g, max_grad_norm=0.5, clipping=clipping)
    without = clip_and_sum([x[[0, 1, 3]] for x in g], max_grad_norm=0.5, clipping=clipping)
    for a, b in zip(result.summed, without.summed, strict=True):
        torch.testing.assert_close(a, b)
    assert bool((result.factors[..., 2] == 0).all())  # [B] for flat, [L, B] for per-layer
