"""Noise: the right std, reproducible with a seed, and a secure mode that works."""

import pytest
import torch
from torch import nn

from dpnotebook.privacy._mechanisms import draw_noise, gaussian_noise, secure_normal, secure_uniform


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
    want = [gaussian_noise(p.shape, std=2.0, generator=g) for p in params]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
