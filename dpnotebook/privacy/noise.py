"""Gaussian noise for DP-SGD: seedable for teaching, or from the OS's secure randomness.

The noise added to the clipped sum has standard deviation ``sigma * C``
(``noise_multiplier * max_grad_norm``).

* Default (``secure=False``): PyTorch's generator (Mersenne Twister on CPU).
  Pass a seeded ``torch.Generator`` and a run is reproducible, which is what
  you want in a notebook. It is *not* a cryptographic generator: someone who
  learns its state can predict, hence subtract, the noise.
* ``secure=True``: every uniform number comes from :func:`os.urandom`, the
  operating system's CSPRNG, and is turned into a normal one by the Box-Muller
  transform in float64. Floating-point normals have gaps that can leak the
  unnoised value (Mironov, CCS 2012); following Holohan & Braghin (2021) and
  Opacus, the secure noise is the sum of 4 independent normals of std ``s``
  divided by 2 (still std ``s``), which fills those gaps. It costs about 32
  random bytes per number, so it is slower; use it for real releases.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> gaussian_noise((3,), std=1.0, generator=g)
tensor([ 1.5410, -0.2934, -2.1788])
>>> gaussian_noise((2, 2), std=0.0)
tensor([[0., 0.],
        [0., 0.]])
>>> gaussian_noise((1000,), std=2.0, secure=True).std().round()
tensor(2.)
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["gaussian_noise", "draw_noise", "secure_uniform", "secure_normal", "warn_insecure_noise_once"]

#: Secure noise is the sum of this many normals, divided by sqrt(this) to keep the std.
SECURE_NOISE_TERMS = 4

_WARNED_INSECURE = [False]


def warn_insecure_noise_once() -> bool:
    """Warn, once per process, that the noise comes from PyTorch's (predictable) generator; ``True`` if it warned.

    DP optimizers call it when they first draw noise and the user chose neither
    ``secure_mode=True`` nor ``secure_mode=False`` nor a seeded generator.
    """
    if _WARNED_INSECURE[0]:
        return False
    _WARNED_INSECURE[0] = True
    from dpnotebook.errors import PrivacyWarning

    warnings.warn(
        "The DP noise comes from PyTorch's generator, which is not cryptographically secure: whoever "
        "learns its state can predict and subtract the noise. For a real release use "
        "secure_mode=True (PrivacyEngine or DPOptimizer); to reproduce a seeded run, say so with "
        "secure_mode=False or pass a seeded noise generator, and this warning goes away.",
        PrivacyWarning,
        stacklevel=3,
    )
    return True


def secure_uniform(n: int) -> Tensor:
    """``n`` float64 numbers uniform on (0, 1], each from 53 random bits of :func:`os.urandom`.

    >>> u = secure_uniform(5)
    >>> bool(((u > 0) & (u <= 1)).all()), u.dtype
    (True, torch.float64)
    """
    if n == 0:
        return torch.empty(0, dtype=torch.float64)
    words = torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64)
    mantissa = (words >> 11) & ((1 << 53) - 1)  # the top 53 bits, as a non-negative int
    return (mantissa.to(torch.float64) + 1.0) / float(1 << 53)


def secure_normal(n: int) -> Tensor:
    """``n`` float64 standard normals from :func:`secure_uniform` by the Box-Muller transform.

    >>> secure_normal(4).shape
    torch.Size([4])
    """
    pairs = (n + 1) // 2
    u1, u2 = secure_uniform(pairs), secure_uniform(pairs)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2.0 * math.pi * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]


def gaussian_noise(
    shape: Sequence[int] | torch.Size,
    *,
    std: float,
    generator: torch.Generator | None = None,
    secure: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """A tensor of independent ``N(0, std^2)`` numbers.

    Args:
        shape: the shape of the result, e.g. ``p.shape``.
        std: the standard deviation (>= 0); for DP-SGD ``noise_multiplier * max_grad_norm``.
        generator: a ``torch.Generator`` (seed it for reproducible runs). Must
            be ``None`` when ``secure``.
        secure: draw from the OS CSPRNG (see the module docstring).
        dtype: the result's floating dtype.
        device: the result's device (a generator must live on that device).

    Raises:
        ValueError: ``std`` < 0, or a ``generator`` together with ``secure=True``.
    """
    if not (std >= 0) or math.isinf(std):
        raise ValueError(f"std={std!r} is invalid: the noise std must be a finite number >= 0.")
    if secure and generator is not None:
        raise ValueError(
            f"generator={generator!r} with secure=True: a seeded generator is predictable, hence "
            "not secure. Fix: pass generator=None for secure noise, or secure=False to reproduce a run."
        )
    shape = torch.Size(shape)
    if std == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    if not secure:
        return torch.normal(0.0, std, size=shape, generator=generator, dtype=dtype, device=device)
    total = torch.zeros(shape.numel(), dtype=torch.float64)
    for _ in range(SECURE_NOISE_TERMS):
        total += secure_normal(shape.numel())
    noise = total * (std / math.sqrt(SECURE_NOISE_TERMS))
    return noise.reshape(shape).to(dtype=dtype, device=device)


def draw_noise(
    params: Sequence[Tensor], std: float, generator: torch.Generator | None = None, secure: bool = False
) -> list[Tensor]:
    """``N(0, std^2)`` noise shaped like each of ``params``: what a DP optimizer adds in one step.

    Each parameter's noise is :func:`gaussian_noise`'s, drawn in order from
    ``generator``, on the parameter's device and in its dtype: a seeded run
    repeats exactly, on any number of threads.

    >>> import torch
    >>> params = [torch.zeros(2, 3), torch.zeros(4)]
    >>> [tuple(n.shape) for n in draw_noise(params, 1.0, torch.Generator().manual_seed(0))]
    [(2, 3), (4,)]
    """
    return [
        gaussian_noise(p.shape, std=std, generator=generator, secure=secure, dtype=p.dtype, device=p.device)
        for p in params
    ]
