"""Seeded augmentations: ``K`` copies of each sample, sample-major; copy ``k`` is the same for every ``K > k``.

>>> import torch
>>> x = torch.zeros(2, 3)
>>> augment_copies(x, 2, strength=0.0).shape     # rows: sample 0 twice, then sample 1 twice
torch.Size([4, 3])
>>> a = augment_copies(x, 3, seed=1)
>>> torch.equal(a.view(2, 3, 3)[:, :2], augment_copies(x, 2, seed=1).view(2, 2, 3))
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpnotebook.grad_sample._engine.hooks import check_k
from dpnotebook.widgets._validate import non_negative, one_of

__all__ = ["augment_copies", "AUGMENTATIONS"]

AUGMENTATIONS = ("noise", "shift")


def _copy(x: Tensor, k: int, kind: str, strength: float, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed * 100_003 + k)
    if kind == "noise":
        return x + strength * torch.randn(x.shape, generator=gen, dtype=x.dtype)
    s = int(round(strength))
    shifts = torch.randint(-s, s + 1, (x.shape[0], 2), generator=gen)
    return torch.stack(
        [torch.roll(img, (int(a), int(b)), dims=(-2, -1)) for img, (a, b) in zip(x, shifts, strict=True)]
    )


def augment_copies(x: Tensor, K: int, *, kind: str = "noise", strength: float = 0.5, seed: int = 0) -> Tensor:
    """``K`` augmented copies of every row of ``x``, as ``B*K`` rows, sample-major.

    Args:
        x: ``B`` samples, ``[B, ...]``.
        K: copies per sample (>= 1).
        kind: ``"noise"`` (Gaussian noise of std ``strength``) or ``"shift"`` (roll images
            ``[B, ..., H, W]`` by up to ``strength`` pixels each way).
        strength: the noise std, or the largest shift in pixels.
        seed: copies are seeded by ``(seed, copy index)``.

    Returns:
        ``[B*K, ...]``: rows ``i*K .. i*K+K-1`` are the copies of sample ``i``.
    """
    K = check_k(K)
    one_of("kind", kind, AUGMENTATIONS)
    strength = non_negative("strength", strength)
    if kind == "shift" and x.dim() < 3:
        raise ValueError(f"kind='shift' needs images [B, ..., H, W]; got x of shape {tuple(x.shape)}.")
    copies = torch.stack([_copy(x, k, kind, strength, seed) for k in range(K)], dim=1)
    return copies.reshape(x.shape[0] * K, *x.shape[1:])
