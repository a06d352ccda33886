"""The DP step's maths: clipping bounds every sample for any shapes; noise has the right std, seeded or secure;
the textbook mechanisms' distributions and formulas; the errors for bad input."""

import math

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpnotebook.audit import gaussian_epsilon
from dpnotebook.privacy import (
    amplified_by_subsampling,
    clip_and_sum,
    clip_factors,
    compute_epsilon,
    gaussian_mechanism,
    gaussian_noise,
    gaussian_rdp,
    laplace_mechanism,
    layer_thresholds,
    per_layer_norms,
    per_sample_norms,
    randomized_response,
    subsampled_gaussian_rdp,
)
from dpnotebook.privacy._mechanisms import draw_noise, secure_normal, secure_uniform

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


@pytest.mark.parametrize("secure", [False, True])
def test_measured_std_within_3_percent(secure):
    sigma, C = 1.3, 0.7
    gen = None if secure else torch.Generator().manual_seed(0)
    noise = gaussian_noise((200_000,), std=sigma * C, generator=gen, secure=secure, dtype=torch.float64)
    assert abs(noise.std().item() / (sigma * C) - 1) < 0.03
    assert abs(noise.mean().item()) < 0.01


def test_secure_normals_have_normal_quantiles():
    z = secure_normal(100_001)
    assert z.shape == (100_001,)
    within_one = (z.abs() < 1).double().mean().item()
    within_two = (z.abs() < 2).double().mean().item()
    assert within_one == pytest.approx(0.6827, abs=0.01)
    assert within_two == pytest.approx(0.9545, abs=0.005)
    u = secure_uniform(50_000)
    assert u.min() > 0 and u.max() <= 1 and u.mean().item() == pytest.approx(0.5, abs=0.01)


def test_seeded_generator_reproducible_and_secure_is_not():
    a = gaussian_noise((5, 5), std=1.0, generator=torch.Generator().manual_seed(3))
    b = gaussian_noise((5, 5), std=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    c = gaussian_noise((5, 5), std=1.0, secure=True)
    d = gaussian_noise((5, 5), std=1.0, secure=True)
    assert not torch.equal(c, d)


def test_dtype_device_and_zero_std():
    x = gaussian_noise((2, 3), std=2.0, dtype=torch.float64)
    assert x.dtype == torch.float64 and x.shape == (2, 3)
    assert (gaussian_noise((4,), std=0.0, secure=True) == 0).all()
    assert gaussian_noise((3,), std=1.0, secure=True, dtype=torch.float16).dtype == torch.float16


def test_secure_refuses_a_generator_and_negative_std():
    with pytest.raises(ValueError, match="generator=.*secure=True"):
        gaussian_noise((2,), std=1.0, generator=torch.Generator(), secure=True)
    with pytest.raises(ValueError, match="std=-1"):
        gaussian_noise((2,), std=-1.0)


def test_seeded_noise_repeats_whatever_the_thread_count_and_has_the_right_std() -> None:
    threads = torch.get_num_threads()
    params = [nn.Parameter(torch.zeros(400, 400)), nn.Parameter(torch.zeros(7))]
    draws = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            draws.append(draw_noise(params, 3.0, torch.Generator().manual_seed(1), secure=False))
    finally:
        torch.set_num_threads(threads)
    assert [t.shape for t in draws[0]] == [p.shape for p in params]
    assert all(torch.equal(x, y) for other in draws[1:] for x, y in zip(draws[0], other, strict=True))
    flat = torch.cat([t.flatten() for t in draws[0]])
    assert abs(float(flat.std()) - 3.0) < 0.05 and abs(float(flat.mean())) < 0.05


def test_draw_noise_matches_gaussian_noise_per_parameter():
    """Each parameter's noise is gaussian_noise's, in order (seeded runs unchanged)."""
    params = [torch.zeros(3, 4), torch.zeros(5)]
    got = draw_noise(params, 2.0, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    want = [gaussian_noise(p.shape, std=2.0, generator=g, device=p.device) for p in params]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


N = 200_000


@pytest.mark.parametrize("p_truth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_randomized_response_reports_one_with_the_right_probability(p_truth: float) -> None:
    rng = np.random.default_rng(1)
    ones = randomized_response(np.ones(N, dtype=int), p_truth=p_truth, rng=rng)
    zeros = randomized_response(np.zeros(N, dtype=int), p_truth=p_truth, rng=rng)
    tolerance = 5 * 0.5 / math.sqrt(N)  # five standard errors of a frequency
    assert abs(ones.mean() - (1 + p_truth) / 2) < tolerance
    assert abs(zeros.mean() - (1 - p_truth) / 2) < tolerance
    assert ones.dtype.kind == "i" and ones.shape == (N,)


def test_laplace_and_gaussian_noise_have_their_scale() -> None:
    rng = np.random.default_rng(2)
    laplace = laplace_mechanism(np.full(N, 3.0), sensitivity=2.0, epsilon=0.5, rng=rng) - 3.0
    assert abs(np.mean(np.abs(laplace)) - 4.0) < 0.05  # E|Laplace(b)| = b = sensitivity / epsilon
    assert abs(np.median(laplace)) < 0.05
    gauss = gaussian_mechanism(np.full(N, -1.0), noise_std=3.0, rng=rng) + 1.0
    assert abs(gauss.std() - 3.0) < 0.03 and abs(gauss.mean()) < 0.03
    assert laplace_mechanism(5.0, sensitivity=1.0, epsilon=1.0, rng=rng).shape == ()


def test_amplification_is_the_formula_and_never_below_the_accountant() -> None:
    assert amplified_by_subsampling(1.5, 1e-5, sample_rate=1.0) == pytest.approx((1.5, 1e-5))
    previous = 0.0
    for q in (1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0):
        eps, delta = amplified_by_subsampling(1.0, 1e-5, sample_rate=q)
        assert eps == pytest.approx(math.log(1 + q * (math.e - 1)), rel=1e-12) and delta == pytest.approx(q * 1e-5)
        assert previous < eps <= 1.0  # grows with q, and subsampling never costs privacy
        previous = eps
    # applied to the Gaussian's exact epsilon, it is tight for one step: the PLD accountant (an upper bound
    # on the true epsilon, as the formula is) gives the same epsilon at q * delta
    for sigma, q in [(1.0, 0.01), (2.0, 0.1), (0.8, 0.3), (1.0, 0.001), (4.0, 0.5)]:
        eps, delta = amplified_by_subsampling(gaussian_epsilon(1 / sigma, 1e-5), 1e-5, sample_rate=q)
        accountant = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=1, delta=delta, accountant="pld")
        assert accountant == pytest.approx(eps, rel=2e-4)


def test_gaussian_rdp_is_dp_accountings_at_every_order() -> None:
    orders = [1.5, 2.0, 3.25, 8.0, 64.0]
    accountant = dp_accounting.rdp.RdpAccountant(orders)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(1.0, dp_accounting.GaussianDpEvent(1.3)), 7)
    ours = 7 * gaussian_rdp(np.array(orders), noise_multiplier=1.3)
    assert ours == pytest.approx(list(accountant._rdp), rel=1e-9)  # private attribute: a cross-check only
    assert gaussian_rdp(5.0, noise_multiplier=0.7) == pytest.approx(subsampled_gaussian_rdp(0.7, 1.0, 5))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda rng: randomized_response([0, 1, 3], p_truth=0.5, rng=rng), "bits=.*other than 0 and 1"),
        (lambda rng: randomized_response([0, 1], p_truth=1.5, rng=rng), r"p_truth=1.5 .*\[0, 1\]"),
        (lambda rng: randomized_response([0, 1], p_truth=0.5, rng=0), "rng=0 is not a numpy Generator"),
        (lambda rng: laplace_mechanism(1.0, sensitivity=1.0, epsilon=0.0, rng=rng), "epsilon=0.0"),
        (lambda rng: laplace_mechanism(1.0, sensitivity=-1.0, epsilon=1.0, rng=rng), "sensitivity=-1.0"),
        (lambda rng: gaussian_mechanism(1.0, noise_std=0.0, rng=rng), "noise_std=0.0"),
        (lambda rng: amplified_by_subsampling(math.inf, 0.0, sample_rate=0.1), "epsilon=inf"),
        (lambda rng: amplified_by_subsampling(1.0, 2.0, sample_rate=0.1), "delta=2.0"),
        (lambda rng: amplified_by_subsampling(1.0, 0.0, sample_rate=0.0), "sample_rate=0.0"),
        (lambda rng: gaussian_rdp(1.0, noise_multiplier=1.0), "alpha=1.0 .*> 1"),
        (lambda rng: gaussian_rdp(2.0, noise_multiplier=0.0), "noise_multiplier=0 .*no finite RDP"),
    ],
)
def test_bad_input_is_named(call, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call(np.random.default_rng(0))


def test_a_generator_draws_on_its_own_device_and_the_noise_is_moved(monkeypatch: pytest.MonkeyPatch):
    """A CPU generator for a model elsewhere (a GPU; here "meta", which needs no GPU): drawn on the CPU
    (a CUDA draw from a CPU generator raises), then moved, so a seeded run draws the same noise on any device."""
    asked: list[torch.device] = []
    normal = torch.normal

    def recording(*args, **kwargs):
        asked.append(torch.device(kwargs["device"]))
        return normal(*args, **kwargs)

    monkeypatch.setattr(torch, "normal", recording)
    g = torch.Generator().manual_seed(4)
    moved = gaussian_noise((3, 2), std=1.5, generator=g, device="meta")
    assert moved.device.type == "meta" and moved.shape == (3, 2)
    assert asked == [torch.device("cpu")]  # drawn where the generator is
    here = gaussian_noise((3, 2), std=1.5, device="meta")  # no generator: the target device's own
    assert here.device.type == "meta" and asked[-1] == torch.device("meta")
