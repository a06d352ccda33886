"""One training step of each benchmarked configuration, as a closure ``step()``.

A configuration is named by what it runs:

=========================  ===================================================================
``nonprivate``             plain SGD step with ``torch.nn`` layers (the reference)
``nonprivate_dplayers``    the same with dpnotebook's DP layers (``DPLSTM``, ``DPMultiheadAttention``)
``gsm_<mode>``             forward + backward with per-sample gradients (ghost: with the norms)
``dpsgd_<mode>``           full DP-SGD step: clip, sum, noise, SGD update
``naive_microbatch``       DP-SGD by one forward/backward per sample, clipping each
``opacus_gsm_<mode>``      Opacus 1.6's per-sample gradients (``--compare-opacus``)
``opacus_dpsgd_<mode>``    Opacus 1.6's DP-SGD step via ``PrivacyEngine.make_private``
=========================  ===================================================================

>>> step = make_step("MLP", "dpsgd_ghost", batch=4, K=2)
>>> step()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.benchmarks.models import build
from dpnotebook.benchmarks.settings import CLIP, LR, SIGMA
from dpnotebook.modes import available_modes

if TYPE_CHECKING:
    from dpnotebook.grad_sample.ghost.wrapper import GhostGradSampleModule

#: dpnotebook's modes, read from the mode registry.
MODES = tuple(available_modes())
#: Opacus 1.6's modes (its own names).
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")

Step = Callable[[], None]


def flavour_of(what: str) -> str:
    """Which layer implementations a configuration uses (see :class:`~dpnotebook.benchmarks.models.BenchModel`).

    >>> flavour_of("nonprivate"), flavour_of("dpsgd_hooks"), flavour_of("gsm_ew"), flavour_of("opacus_dpsgd_hooks")
    ('native', 'dp', 'native', 'opacus')
    """
    if what.startswith("opacus_"):
        return "opacus"
    if what in ("nonprivate", "naive_microbatch") or what.endswith("_ew"):
        return "native"  # ExpandedWeights computes nn.LSTM itself and cannot use dpnotebook's DP layers
    return "dp"


def _plain(model: nn.Module, x: Tensor, y: Tensor) -> Step:
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _gsm(model: nn.Module, mode: str, x: Tensor, y: Tensor, K: int) -> Step:
    import dpnotebook

    wrapped = dpnotebook.wrap_model(model, mode, K=K)

    def step() -> None:
        wrapped.zero_grad(set_to_none=True)
        F.cross_entropy(wrapped(x), y).backward()
        if mode == "ghost":
            cast("GhostGradSampleModule", wrapped).per_sample_norms()

    return step


def _dpsgd(model: nn.Module, mode: str, x: Tensor, y: Tensor, batch: int, K: int) -> Step:
    import dpnotebook
    from dpnotebook.privacy import DPOptimizer, GhostDPOptimizer

    wrapped = dpnotebook.wrap_model(model, mode, K=K)
    cls = GhostDPOptimizer if mode == "ghost" else DPOptimizer
    opt = cls(
        torch.optim.SGD(wrapped.parameters(), lr=LR),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=batch,
        secure_mode=False,  # a benchmark: PyTorch's generator, said so (no warning)
    )

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(wrapped(x), y).backward()
        opt.step()

    return step


def dpsgd_step(model: nn.Module, mode: str, x: Tensor, y: Tensor, K: int = 1) -> Step:
    """A full DP-SGD step (per-sample gradients or norms, clipping, noise, SGD update) of ``model`` on
    ``x, y`` (``B*K`` rows, cross-entropy) in grad-sample ``mode``, as a closure; tutorial 06 times it.

    >>> from torch import nn
    >>> step = dpsgd_step(nn.Linear(3, 2), "ghost", torch.randn(8, 3), torch.randint(0, 2, (8,)), K=2)
    >>> step()
    """
    return _dpsgd(model, mode, x, y, x.shape[0] // K, K)


def _naive(model: nn.Module, x: Tensor, y: Tensor, batch: int, K: int) -> Step:
    """Per sample: forward/backward on its K rows, clip the gradient, add it up; then noise and step."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=LR)

    def step() -> None:
        total = [torch.zeros_like(p) for p in params]
        for i in range(batch):
            for p in params:
                p.grad = None
            F.cross_entropy(model(x[i * K : (i + 1) * K]), y[i * K : (i + 1) * K]).backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            factor = (CLIP / (norm + 1e-6)).clamp(max=1.0)
            for t, g in zip(total, grads, strict=True):
                t.add_(g * factor)
        for p, t in zip(params, total, strict=True):
            p.grad = (t + torch.randn_like(t) * (SIGMA * CLIP)) / batch
        opt.step()

    return step


def make_step(name: str, what: str, batch: int, K: int = 1, device: str = "cpu", seed: int = 0) -> Step:
    """The step of configuration ``what`` on model ``name`` with ``batch`` samples of ``K`` rows.

    Raises:
        ValueError: ``what`` is not a configuration name (see the module docstring).
    """
    model, x, y = build(name, batch, K=K, flavour=flavour_of(what), seed=seed)
    model, x, y = model.to(device), x.to(device), y.to(device)
    if what in ("nonprivate", "nonprivate_dplayers"):
        return _plain(model, x, y)
    if what == "naive_microbatch":
        return _naive(model, x, y, batch, K)
    kind, _, mode = what.partition("_")
    if kind == "opacus":
        from dpnotebook.benchmarks.opacus_steps import opacus_step

        kind, _, mode = mode.partition("_")
        return opacus_step(model, kind, mode, x, y, batch)
    if mode in MODES and kind == "gsm":
        return _gsm(model, mode, x, y, K)
    if mode in MODES and kind == "dpsgd":
        return _dpsgd(model, mode, x, y, batch, K)
    raise ValueError(
        f"configuration {what!r} is unknown; use nonprivate, nonprivate_dplayers, naive_microbatch, "
        f"gsm_<mode> or dpsgd_<mode> with mode in {MODES}, or opacus_gsm_<mode> / opacus_dpsgd_<mode>."
    )


__all__ = ["make_step", "flavour_of", "MODES", "OPACUS_MODES"]
