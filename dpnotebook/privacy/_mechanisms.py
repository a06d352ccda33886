"""The maths of a DP-SGD step (clip each sample's gradient, add Gaussian noise) and the textbook mechanisms.

Clipping bounds what one sample can change in the clipped sum, its *sensitivity* ``C``
(:func:`clip_and_sum`); the noise added to the sum has std ``sigma * C`` (:func:`gaussian_noise`).
The textbook mechanisms compute a guarantee by hand (tutorial 03b).

>>> import torch
>>> result = clip_and_sum([torch.tensor([[3.0, 4.0], [0.3, 0.4]])], max_grad_norm=1.0)   # B=2
>>> result.norms, result.summed[0], result.fraction_clipped        # [0.6, 0.8] + [0.3, 0.4]
(tensor([5.0000, 0.5000]), tensor([0.9000, 1.2000]), 0.5)
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from dpnotebook.errors import PrivacyWarning
from dpnotebook.grad_sample._engine.capturable import host_reads_allowed
from dpnotebook.grad_sample._engine.precision import exact_float32, full_precision
from dpnotebook.grad_sample.samplers._contracts import flat_rows
from dpnotebook.privacy._arguments import (
    check_choice,
    check_max_grad_norm,
    check_noise_multiplier,
    check_positive_number,
    check_sample_rate,
    check_unseeded,
)

CLIPPING_MODES = ("flat", "per_layer")

#: Added to the norm before dividing, so that a zero gradient gives factor 1, not nan.
EPS = 1e-6

GradSamples = Sequence[Tensor] | Mapping[str, Tensor]
Bounds = float | list[float]
FloatArray = npt.NDArray[np.float64]


def check_layer_bounds(value: Any, clipping: str) -> Bounds:
    """``max_grad_norm`` checked: a number > 0, or (``clipping="per_layer"`` only) a list of them.

    >>> check_layer_bounds([1.0, 2.0], "flat")
    Traceback (most recent call last):
    ...
    ValueError: max_grad_norm=[1.0, 2.0] is a list of ... bounds but clipping='flat'. Fix: pass clipping='per_layer' ...
    """
    if isinstance(value, (list, tuple)):
        if clipping != "per_layer":
            raise ValueError(
                f"max_grad_norm={list(value)!r} is a list of per-layer bounds but clipping={clipping!r}. "
                "Fix: pass clipping='per_layer' with the list, or one number for flat clipping."
            )
        if not value:
            raise ValueError("max_grad_norm=[] is empty: pass one bound per trainable parameter tensor.")
        return [check_max_grad_norm(c) for c in value]
    return check_max_grad_norm(value)


def total_bound(bounds: Bounds | tuple[float, ...]) -> float:
    """The sensitivity: ``C`` itself, or ``sqrt(sum c_l^2)`` for a list."""
    if isinstance(bounds, (list, tuple)):
        return math.sqrt(sum(c * c for c in bounds))
    return float(bounds)


def layer_thresholds(max_grad_norm: float, num_layers: int) -> float:
    """The per-layer bound ``C / sqrt(L)``: ``L`` layers clipped to it have total norm <= ``C``.

    >>> layer_thresholds(1.0, 4)
    0.5
    """
    return check_max_grad_norm(max_grad_norm) / math.sqrt(num_layers)


def layer_bound_list(bounds: Bounds | tuple[float, ...], num_layers: int) -> list[float]:
    """One bound per parameter tensor: the list itself, or ``C / sqrt(L)`` each."""
    if isinstance(bounds, (list, tuple)):
        if len(bounds) != num_layers:
            raise ValueError(
                f"max_grad_norm has {len(bounds)} per-layer bounds but there are {num_layers} trainable "
                f"parameter tensors. Fix: pass one bound per tensor, in the order of model.parameters() "
                "(trainable ones only)."
            )
        return [float(c) for c in bounds]
    return [layer_thresholds(bounds, num_layers)] * num_layers


def _as_list(grad_samples: GradSamples) -> list[Tensor]:
    values = list(grad_samples.values()) if isinstance(grad_samples, Mapping) else list(grad_samples)
    values = [full_precision(g) for g in values]  # a bf16/fp16 norm can come out too small: clip in float32
    if not values:
        raise ValueError("grad_samples is empty: pass one [B, *shape] tensor per parameter.")
    rows = {g.shape[0] for g in values}
    if len(rows) > 1:
        raise ValueError(
            f"grad_samples disagree on the number of samples B (dim 0): {sorted(rows)}. Every "
            "parameter's per-sample gradient must come from the same batch."
        )
    return values


def per_layer_norms(grad_samples: GradSamples) -> Tensor:
    """The norm of each sample's gradient for each parameter tensor: shape ``[L, B]``.

    >>> per_layer_norms([torch.ones(2, 4), torch.ones(2, 3, 3)])
    tensor([[2., 2.],
            [3., 3.]])
    """
    return torch.stack([flat_rows(g).norm(dim=1) for g in _as_list(grad_samples)])


def per_sample_norms(grad_samples: GradSamples) -> Tensor:
    """The norm of each sample's whole gradient (all parameters flattened together): shape ``[B]``.

    >>> per_sample_norms([torch.ones(2, 4), torch.ones(2, 3, 3)])   # sqrt(4 + 9)
    tensor([3.6056, 3.6056])
    """
    return per_layer_norms(grad_samples).norm(dim=0)


def clip_factors(norms: Tensor, max_grad_norm: float) -> Tensor:
    """``min(1, max_grad_norm / (norm + 1e-6))`` for each norm; a NaN or infinite norm gets 0 and a warning.

    >>> clip_factors(torch.tensor([0.0, 0.5, 4.0]), 2.0)
    tensor([1.0000, 1.0000, 0.5000])
    """
    max_grad_norm = check_max_grad_norm(max_grad_norm)
    return masked_clip_factors(norms, max_grad_norm, nonfinite_mask(norms))


def masked_clip_factors(norms: Tensor, max_grad_norm: float, finite: Tensor | None) -> Tensor:
    """:func:`clip_factors` with the samples' ``finite`` mask already read (``None``: all finite)."""
    factors = (max_grad_norm / (norms + EPS)).clamp(max=1.0)
    return factors if finite is None else torch.where(finite, factors, torch.zeros_like(factors))


def nonfinite_mask(norms: Tensor) -> Tensor | None:
    """``None`` if every per-sample norm (``[B]``) is finite, else ``isfinite(norms)`` and a warning.

    The usual case costs one reduction and the step's one read on the host (a GPU waits for it once).
    Inside :func:`~dpnotebook.grad_sample._engine.capturable.capturable_step` (a step a CUDA graph
    captures) it reads nothing and always returns the mask: the same sum, one ``where`` per parameter more,
    and the warning is the caller's to give.

    >>> from dpnotebook.grad_sample._engine.capturable import capturable_step
    >>> with capturable_step():
    ...     nonfinite_mask(torch.tensor([1.0, float("nan")]))
    tensor([ True, False])
    """
    if not host_reads_allowed():
        return torch.isfinite(norms)
    if math.isfinite(float(norms.sum())):
        return None
    finite = torch.isfinite(norms)
    if bool(finite.all()):
        return None
    warnings.warn(
        f"{int((~finite).sum())} sample(s) of {finite.numel()} have a NaN or infinite gradient norm; they get "
        "clip factor 0 and add nothing to this step. Check the loss and the inputs "
        "of those samples (an overflow, a log of 0).",
        PrivacyWarning,
        stacklevel=3,
    )
    return finite


@dataclass
class ClipResult:
    """What :func:`clip_and_sum` computed, for the optimizer and for plots.

    Attributes:
        summed: the clipped per-sample gradients summed over the batch, one tensor per parameter.
        sensitivity: the largest change one sample can make to ``summed`` (the total bound ``C``).
        norms: each sample's total gradient norm before clipping, ``[B]``.
        layer_norms: each sample's norm per parameter tensor before clipping, ``[L, B]``.
        factors: the clip factors: ``[B]`` for ``"flat"``, ``[L, B]`` for ``"per_layer"``.
        num_clipped: how many samples were scaled down (in any layer), a 0-dim tensor on their device.
        clipping: ``"flat"`` or ``"per_layer"``.
    """

    summed: list[Tensor]
    sensitivity: float
    norms: Tensor
    layer_norms: Tensor
    factors: Tensor
    num_clipped: Tensor
    clipping: str

    @property
    def fraction_clipped(self) -> float:
        """The fraction of samples scaled down (in any layer); read on the host when asked."""
        return int(self.num_clipped) / self.batch_size if self.batch_size else 0.0

    @property
    def batch_size(self) -> int:
        """The number of samples B that were clipped."""
        return int(self.norms.shape[0])


@exact_float32()  # the sums are matrix products: never rounded to TF32 or bfloat16 (engine.precision)
def clip_and_sum(
    grad_samples: GradSamples, *, max_grad_norm: float | Sequence[float], clipping: str = "flat"
) -> ClipResult:
    """Clip every sample's gradient to norm ``max_grad_norm`` and sum over the batch.

    One sample then changes the sum by at most ``C``, the sensitivity. ``"flat"`` clips each sample's
    norm over all parameters; ``"per_layer"`` clips each parameter tensor to ``c_l`` (``C / sqrt(L)``,
    or a list of bounds whose total ``sqrt(sum c_l^2)`` is the sensitivity).

    Args:
        grad_samples: one tensor ``[B, *p.shape]`` per parameter (a list, or a dict's values).
        max_grad_norm: the bound C (> 0; ``math.inf`` disables clipping), or with ``"per_layer"`` a list.
        clipping: ``"flat"`` or ``"per_layer"``.

    >>> g = [torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 4.0]])]   # 2 parameters, B=1
    >>> clip_and_sum(g, max_grad_norm=1.0, clipping="per_layer").summed   # each to 1/sqrt(2)
    [tensor([0.7071, 0.0000]), tensor([0.0000, 0.7071])]
    """
    check_choice("clipping", clipping, CLIPPING_MODES)
    bounds = check_layer_bounds(max_grad_norm, clipping)
    max_grad_norm = total_bound(bounds)
    grads = _as_list(grad_samples)
    layer_norms = per_layer_norms(grads)
    norms = layer_norms.norm(dim=0)
    finite = nonfinite_mask(norms)
    if finite is not None:  # a sample with a non-finite norm adds nothing: zero its rows (0 * NaN is NaN)
        grads = [torch.where(finite.reshape(-1, *([1] * (g.dim() - 1))), g, g.new_zeros(())) for g in grads]
    if clipping == "flat":
        factors = masked_clip_factors(norms, max_grad_norm, finite)
        clipped = factors < 1
        summed = [torch.tensordot(factors.to(g.dtype), g, dims=1) for g in grads]
    else:
        bounds_l = layer_bound_list(bounds, len(grads))
        factors = torch.stack([masked_clip_factors(n, c, finite) for n, c in zip(layer_norms, bounds_l, strict=True)])
        clipped = (factors < 1).any(dim=0)
        summed = [torch.tensordot(f.to(g.dtype), g, dims=1) for f, g in zip(factors, grads, strict=True)]
    return ClipResult(summed, max_grad_norm, norms, layer_norms, factors, clipped.sum(), clipping)


#: Secure noise is the sum of this many normals, divided by sqrt(this).
SECURE_NOISE_TERMS = 4

_WARNED_INSECURE = [False]


def warn_insecure_noise_once() -> bool:
    """Warn, once per process, that the noise comes from PyTorch's (predictable) generator; ``True`` if it warned."""
    if _WARNED_INSECURE[0]:
        return False
    _WARNED_INSECURE[0] = True
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
    """``n`` float64 numbers uniform on (0, 1], each from 53 random bits of :func:`os.urandom`."""
    if n == 0:
        return torch.empty(0, dtype=torch.float64, device="cpu")  # the CPU, whatever the default device
    words = torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64)
    mantissa = (words >> 11) & ((1 << 53) - 1)  # the top 53 bits, as a non-negative int
    return (mantissa.to(torch.float64) + 1.0) / float(1 << 53)


def secure_normal(n: int) -> Tensor:
    """``n`` float64 standard normals from :func:`secure_uniform` by the Box-Muller transform."""
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

    By default from PyTorch's generator (seedable, *not* cryptographic). With ``secure=True`` the
    uniforms come from :func:`os.urandom`; the result is the sum of 4 Box-Muller normals divided
    by 2, which fills the gaps of floating-point normals (Holohan & Braghin 2021).

    Args:
        shape: the shape of the result, e.g. ``p.shape``.
        std: the standard deviation (>= 0); for DP-SGD ``noise_multiplier * max_grad_norm``.
        generator: a ``torch.Generator`` (on any device: the draw is made there and moved to ``device``);
            ``None`` for PyTorch's default generator of ``device``, and when ``secure``.
        secure: draw from the OS CSPRNG.
        dtype: the result's floating dtype.
        device: the result's device.

    Raises:
        ValueError: ``std`` < 0, or a ``generator`` together with ``secure=True``.

    >>> gaussian_noise((3,), std=1.0, generator=torch.Generator().manual_seed(0))
    tensor([ 1.5410, -0.2934, -2.1788])
    >>> gaussian_noise((1000,), std=2.0, secure=True).std().round()
    tensor(2.)
    """
    if not (std >= 0) or math.isinf(std):
        raise ValueError(f"std={std!r} is invalid: the noise std must be a finite number >= 0.")
    check_unseeded("generator", generator, secure, flag="secure")
    shape = torch.Size(shape)
    if std == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    if not secure:
        # A generator draws on its own device: a CPU generator's noise for a GPU model is drawn on the CPU
        # and moved, so a seeded run gives the same noise on either device.
        where = generator.device if generator is not None else device
        noise = torch.normal(0.0, std, size=shape, generator=generator, dtype=dtype, device=where)
        return noise.to(device)
    total = torch.zeros(shape.numel(), dtype=torch.float64, device="cpu")  # where the OS's random bytes land
    for _ in range(SECURE_NOISE_TERMS):
        total += secure_normal(shape.numel())
    noise = total * (std / math.sqrt(SECURE_NOISE_TERMS))
    return noise.reshape(shape).to(dtype=dtype, device=device)


def draw_noise(
    params: Sequence[Tensor], std: float, generator: torch.Generator | None = None, secure: bool = False
) -> list[Tensor]:
    """``N(0, std^2)`` noise shaped like each of ``params`` (device, dtype), drawn in order from ``generator``."""
    return [
        gaussian_noise(p.shape, std=std, generator=generator, secure=secure, dtype=p.dtype, device=p.device)
        for p in params
    ]


def check_streams_apart(
    noise: torch.Generator | None, sampling: torch.Generator | None, *, noise_device: torch.device, distributed: bool
) -> None:
    """Refuse noise drawn from the random numbers that also choose the batches (``None``: the global generator).

    The privacy analysis takes the noise to be independent of which samples are in a batch. Two
    generators of one kind seeded alike replay one stream, so the noise of one step would be made of
    the numbers that drew some batch. One generator used for both is one stream read in turn, except
    across ranks: rank 0 draws the noise from it and the other ranks do not.

    >>> check_streams_apart(torch.Generator().manual_seed(0), torch.Generator().manual_seed(1),
    ...                     noise_device=torch.device("cpu"), distributed=False)      # apart: nothing raised
    """
    if noise is None and noise_device.type != "cpu":
        return  # the device's own generator (Philox on CUDA); the batches are drawn on the CPU
    noise, sampling = noise or torch.default_generator, sampling or torch.default_generator
    if noise is sampling and not distributed or noise.device.type != sampling.device.type:
        return  # one stream read in turn, or two generators of different kinds
    if noise is sampling or noise.initial_seed() == sampling.initial_seed():
        what = (
            "is the generator" if noise is sampling else f"is seeded like the generator (seed {noise.initial_seed()})"
        )
        raise ValueError(
            f"The noise generator {what} that draws the batches (the data loader's, sampling_generator, or "
            f"torch's global one where None is given){' on another rank' if noise is sampling else ''}: the "
            "noise would repeat the numbers that chose the samples, which the privacy analysis takes to be "
            "independent. Fix: give noise_generator and sampling_generator seeds of their own (e.g. seed and "
            "seed + 1), also apart from torch.manual_seed's."
        )


def _generator(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng={rng!r} is not a numpy Generator. Fix: pass rng=np.random.default_rng(seed), so that "
            "every draw of the mechanism is seeded and reproducible."
        )
    return rng


def randomized_response(bits: object, *, p_truth: float, rng: np.random.Generator) -> npt.NDArray[np.int_]:
    """Each bit (0 or 1) reported truthfully with probability ``p_truth``, otherwise replaced by a fair coin.

    >>> answers = randomized_response(np.ones(100_000, dtype=int), p_truth=0.5, rng=np.random.default_rng(0))
    >>> round(float(answers.mean()), 2)                  # truth 1/2 + a coin that says 1 half the time
    0.75
    >>> randomized_response([2], p_truth=0.5, rng=np.random.default_rng(0))
    Traceback (most recent call last):
    ...
    ValueError: bits=[2] holds values other than 0 and 1. Fix: pass each person's true answer as 0 or 1.
    """
    rng = _generator(rng)
    truth = np.asarray(bits)
    if truth.size and not np.isin(truth, (0, 1)).all():
        raise ValueError(
            f"bits={bits!r} holds values other than 0 and 1. Fix: pass each person's true answer as 0 or 1."
        )
    if isinstance(p_truth, bool) or not isinstance(p_truth, (int, float)) or not 0 <= p_truth <= 1:
        raise ValueError(f"p_truth={p_truth!r} is invalid: it is a probability, in [0, 1]. Fix: pass e.g. p_truth=0.5.")
    truthful = rng.random(truth.shape) < p_truth
    coins = rng.integers(0, 2, size=truth.shape)
    return np.where(truthful, truth, coins).astype(int)


def laplace_mechanism(
    value: float | FloatArray, *, sensitivity: float, epsilon: float, rng: np.random.Generator
) -> FloatArray:
    """``value`` plus Laplace noise of scale ``sensitivity`` (L1) ``/ epsilon``: ``(epsilon, 0)``-DP.

    >>> noisy = laplace_mechanism(np.full(200_000, 10.0), sensitivity=1.0, epsilon=0.5, rng=np.random.default_rng(0))
    >>> round(float(np.mean(np.abs(noisy - 10.0))), 1)    # E|Laplace(b)| = b = 1 / 0.5
    2.0
    """
    rng = _generator(rng)
    scale = check_positive_number("sensitivity", sensitivity) / check_positive_number("epsilon", epsilon)
    centre = np.asarray(value, dtype=float)
    return centre + rng.laplace(0.0, scale, size=centre.shape)


def gaussian_mechanism(value: float | FloatArray, *, noise_std: float, rng: np.random.Generator) -> FloatArray:
    """``value`` plus Gaussian noise of std ``noise_std`` (a DP-SGD step without subsampling, at ``sigma C``).

    >>> round(float(np.std(gaussian_mechanism(np.zeros(100_000), noise_std=2.0, rng=np.random.default_rng(0)))), 2)
    2.0
    """
    rng = _generator(rng)
    std = check_positive_number("noise_std", noise_std)
    centre = np.asarray(value, dtype=float)
    return centre + rng.normal(0.0, std, size=centre.shape)


def amplified_by_subsampling(epsilon: float, delta: float, *, sample_rate: float) -> tuple[float, float]:
    """The guarantee of an ``(epsilon, delta)``-DP mechanism run on a Poisson sample of rate ``q``.

    ``(ln(1 + q (e^epsilon - 1)), q delta)``-DP with add/remove neighbours (Balle, Barthe & Gaboardi 2018).

    >>> eps, delta = amplified_by_subsampling(1.0, 1e-6, sample_rate=0.01)
    >>> round(eps, 4), delta                              # ln(1 + 0.01 (e - 1))
    (0.017, 1e-08)
    >>> amplified_by_subsampling(-1.0, 0.0, sample_rate=0.5)
    Traceback (most recent call last):
    ...
    ValueError: epsilon=-1.0 is invalid: it must be a finite number >= 0. Fix: pass the mechanism's own epsilon.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (0 <= epsilon < math.inf):
        raise ValueError(
            f"epsilon={epsilon!r} is invalid: it must be a finite number >= 0. Fix: pass the mechanism's own epsilon."
        )
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta <= 1:
        raise ValueError(f"delta={delta!r} is invalid: it must be in [0, 1]. Fix: pass the mechanism's own delta.")
    q = check_sample_rate(sample_rate)
    return float(math.log1p(q * math.expm1(epsilon))), float(q * delta)


def gaussian_rdp(alpha: float | FloatArray, *, noise_multiplier: float) -> float | FloatArray:
    """The Gaussian mechanism's Rényi DP at order(s) ``alpha > 1``: ``alpha / (2 sigma^2)`` (sigma in sensitivities).

    >>> gaussian_rdp(2.0, noise_multiplier=1.0), gaussian_rdp(np.array([2.0, 11.0]), noise_multiplier=2.0).tolist()
    (1.0, [0.25, 1.375])
    """
    sigma = check_noise_multiplier(noise_multiplier)
    if sigma == 0:
        raise ValueError(
            "noise_multiplier=0 is invalid here: without noise the Gaussian mechanism has no finite RDP. "
            "Fix: pass the noise multiplier sigma > 0."
        )
    orders = np.asarray(alpha, dtype=float)
    if orders.size == 0 or np.isnan(orders).any() or orders.min() <= 1:
        raise ValueError(f"alpha={alpha!r} is invalid: Rényi orders must be > 1. Fix: pass e.g. alpha=2.0.")
    rdp = orders / (2 * sigma**2)
    return float(rdp) if orders.ndim == 0 else rdp
