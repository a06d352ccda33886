"""Canaries for a one-run audit: records put in the training set on a coin flip.

* :func:`draw_inclusion`: one fair coin per canary (the audit's randomness; it must be fair
  and independent of everything else for :func:`~dpnotebook.audit.one_run.audit_one_run`).
* :func:`random_image_canaries`: random black-and-white images with random labels, which a model
  fits only by memorising them one by one (the input canaries of
  :func:`~dpnotebook.audit.experiment.audited_digits_run`).
* :func:`mislabeled_canaries`: real inputs with a wrong label. A model predicts the wrong
  label only if it trained on that very record, so such canaries are easy to detect, the
  worst case an input-space audit can build cheaply.
* :func:`gaussian_mechanism_scores`: the simplest mechanism to audit. Each canary adds
  ``sensitivity`` to its own coordinate of a vector that gets Gaussian noise; the output
  coordinates are the scores. Its true epsilon is known exactly
  (:func:`~dpnotebook.audit.tradeoff.gaussian_epsilon`), and thousands of runs take a second.
* :func:`dp_sgd_canary_scores`: the same for a whole DP-SGD run with *gradient* canaries (Steinke et al.'s
  white-box setting): each canary's gradient is a unit vector of its own, present in a step when the
  canary is in the data and Poisson-sampled; the score is its coordinate after ``steps`` noisy steps.
  The accountant's epsilon for ``(noise_multiplier, sample_rate, steps)`` bounds it.

>>> included = draw_inclusion(8, seed=0)
>>> included.dtype, included.shape
(dtype('bool'), (8,))
>>> scores = gaussian_mechanism_scores(included, noise_multiplier=0.0)   # no noise: the scores are the coins
>>> bool((scores == included).all())
True
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "draw_inclusion",
    "random_image_canaries",
    "mislabeled_canaries",
    "gaussian_mechanism_scores",
    "dp_sgd_canary_scores",
]


def draw_inclusion(canaries: int, *, seed: int) -> np.ndarray:
    """``canaries`` independent fair coins (``True``: put the canary in the training set).

    >>> bool((draw_inclusion(10, seed=1) == draw_inclusion(10, seed=1)).all())     # seeded
    True
    """
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 1:
        raise ValueError(f"canaries={canaries!r} is invalid: it must be an int >= 1, e.g. 1000.")
    return np.random.default_rng(seed).random(canaries) < 0.5


def random_image_canaries(
    canaries: int,
    *,
    shape: tuple[int, ...] = (1, 8, 8),
    num_classes: int = 10,
    seed: int = 0,
    blank: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``canaries`` images of random black-or-white pixels (each 0 or 1 on a fair coin), each with a
    uniform random label.

    Nothing in the data predicts their labels: a model gets one right only by memorising it. Binary
    pixels keep the canaries far apart (and far from the digits), so they are easy to memorise one by one.

    Args:
        canaries: how many.
        shape: of one image.
        num_classes: labels are drawn from ``0 .. num_classes - 1``.
        seed: seeds pixels and labels.
        blank: a boolean mask of ``shape``: pixels kept at 0 in every canary (those blank in every digit).

    >>> x, y = random_image_canaries(3)
    >>> x.shape, y.shape
    (torch.Size([3, 1, 8, 8]), torch.Size([3]))
    >>> bool(random_image_canaries(5, blank=torch.ones(1, 8, 8, dtype=torch.bool))[0].any())
    False
    """
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(canaries, *shape, generator=g) < 0.5).float()
    if blank is not None:
        x[:, blank] = 0.0
    return x, torch.randint(0, num_classes, (canaries,), generator=g)


def mislabeled_canaries(inputs: Tensor, targets: Tensor, *, num_classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """The same inputs, each with a label drawn uniformly among the *other* classes.

    >>> x, y = mislabeled_canaries(torch.zeros(5, 2), torch.tensor([0, 1, 2, 0, 1]), num_classes=3, seed=0)
    >>> bool((y != torch.tensor([0, 1, 2, 0, 1])).all())
    True
    """
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is invalid: a wrong label needs at least 2 classes.")
    if (
        targets.dtype not in (torch.int64, torch.int32)
        or targets.numel()
        and (targets.min() < 0 or targets.max() >= num_classes)
    ):
        raise ValueError(f"targets must be integer labels in [0, {num_classes}); got dtype {targets.dtype}.")
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(1, num_classes, targets.shape, generator=g)
    return inputs.clone(), (targets.long() + shift) % num_classes


def gaussian_mechanism_scores(
    included: np.ndarray, *, noise_multiplier: float, sensitivity: float = 1.0, seed: int = 0
) -> np.ndarray:
    """One run of the Gaussian mechanism on the canaries: ``sensitivity * included + N(0, (sigma sensitivity)^2)``.

    Args:
        included: the coins (:func:`draw_inclusion`).
        noise_multiplier: sigma, the noise std in units of the sensitivity (0: no noise, not private).
        sensitivity: how far one canary moves its coordinate.
        seed: seeds the noise.
    """
    inc = np.asarray(included)
    if inc.dtype != bool:
        raise ValueError(f"included has dtype {inc.dtype}: pass booleans from draw_inclusion.")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier={noise_multiplier!r} is invalid: it must be a finite number >= 0.")
    noise = np.random.default_rng(seed).standard_normal(inc.shape) * noise_multiplier * sensitivity
    return sensitivity * inc.astype(float) + noise


def dp_sgd_canary_scores(
    included: np.ndarray, *, noise_multiplier: float, sample_rate: float, steps: int, seed: int = 0
) -> np.ndarray:
    """The canaries' coordinates after ``steps`` DP-SGD steps with C = 1 and gradient canaries.

    Canary ``i`` owns coordinate ``i``; its clipped gradient is the unit vector there. In each step it
    is in the batch with probability ``sample_rate`` if it is in the data, and every coordinate gets
    noise of std ``noise_multiplier``. The sum over the steps, drawn exactly: a binomial count of the
    steps that sampled the canary plus ``N(0, steps * sigma^2)``.

    >>> included = draw_inclusion(4, seed=0)
    >>> bool((dp_sgd_canary_scores(included, noise_multiplier=0.0, sample_rate=1.0, steps=3) == 3 * included).all())
    True
    """
    inc = np.asarray(included)
    if inc.dtype != bool:
        raise ValueError(f"included has dtype {inc.dtype}: pass booleans from draw_inclusion.")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier={noise_multiplier!r} is invalid: it must be a finite number >= 0.")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r} is invalid: it must be in (0, 1].")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is invalid: it must be an int >= 1.")
    rng = np.random.default_rng(seed)
    sampled = rng.binomial(steps, sample_rate, inc.shape) * inc
    return sampled + rng.standard_normal(inc.shape) * noise_multiplier * math.sqrt(steps)
