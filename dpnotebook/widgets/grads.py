"""Per-sample gradients for the widgets, computed by the library's grad-sample modes.

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> g = compute_grad_samples(nn.Linear(3, 2), torch.randn(4, 3), torch.randn(4, 2), nn.functional.mse_loss)
>>> {k: tuple(v.shape) for k, v in g.items()}
{'weight': (4, 2, 3), 'bias': (4, 2)}
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import cast

import torch
from torch import Tensor, nn

from dpnotebook.compare import mode_result
from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.hooks import GradSampleModule, check_k
from dpnotebook.grad_sample.samplers._contracts import flat_rows
from dpnotebook.modes import Unwrappable, wrap_model

__all__ = ["run_mode", "compute_grad_samples", "flatten_grad_samples", "as_grad_samples", "few_threads"]

#: Inputs with at most this many numbers are computed on one thread (see :func:`few_threads`).
SMALL_INPUT = 200_000

LossFn = Callable[[Tensor, Tensor], Tensor]


@contextlib.contextmanager
def few_threads(small: bool = True) -> Iterator[None]:
    """Run the block on one intra-op thread if ``small`` (waking a second costs more than tiny work)."""
    before = torch.get_num_threads()
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_mode(
    model: nn.Module, inputs: Tensor, targets: Tensor, loss_fn: LossFn, *, mode: str = "hooks", K: int = 1
) -> dict[str, Tensor] | Tensor:
    """One forward and backward pass in grad-sample ``mode``; what the mode computed.

    The model is wrapped with :func:`dpnotebook.wrap_model` and unwrapped again, its ``.grad`` cleared.

    Args:
        model: a plain ``nn.Module`` (or a :class:`~dpnotebook.GradSampleModule`, used as is with its own ``K``).
        inputs: ``B*K`` rows, sample-major (the copies of sample ``i`` are rows ``i*K .. i*K+K-1``).
        targets: ``B`` targets (repeated ``K`` times for the copies) or ``B*K`` targets.
        loss_fn: ``loss_fn(output, targets)`` averaged over rows.
        mode: a grad-sample mode (:func:`dpnotebook.available_modes`).
        K: augmentation multiplicity.

    Returns:
        ``{name: [B, *p.shape]}`` for every trainable parameter, or, for a mode that computes
        norms only (``"ghost"``), each sample's total gradient norm ``[B]`` (detached copies).

    Raises:
        GradSampleError: the mode left a parameter without a per-sample gradient.
    """
    given = model if isinstance(model, GradSampleModule) else None  # a wrapper used as is
    K = check_k(K) if given is None else given.K
    if targets.shape[0] * K == inputs.shape[0] and K > 1:
        targets = targets.repeat_interleave(K, dim=0)
    wrapped = wrap_model(model, mode, K=K) if given is None else given
    try:
        wrapped.zero_grad()
        with few_threads(inputs.numel() <= SMALL_INPUT):
            loss_fn(wrapped(inputs), targets).backward()
        result = mode_result(wrapped, model if given is None else given._module)
        if isinstance(result, Tensor):
            return result.detach().clone()
        missing = [name for name, g in result.items() if g is None]
        if missing:
            raise GradSampleError(f"grad_sample_mode={mode!r} left no per-sample gradient for {missing}.")
        return {name: g.detach().clone() for name, g in result.items() if g is not None}
    finally:
        if given is None:
            cast(Unwrappable, wrapped).to_standard_module()  # every mode's wrapper has it
            model.zero_grad(set_to_none=True)
        else:
            wrapped.zero_grad()


def compute_grad_samples(
    model: nn.Module, inputs: Tensor, targets: Tensor, loss_fn: LossFn, *, mode: str = "hooks", K: int = 1
) -> dict[str, Tensor]:
    """Each sample's gradient by parameter name, ``{name: [B, *p.shape]}``, from :func:`run_mode`.

    Raises:
        ValueError: ``mode`` computes norms only (``"ghost"``).
    """
    grads = run_mode(model, inputs, targets, loss_fn, mode=mode, K=K)
    if isinstance(grads, Tensor):
        raise ValueError(
            f"grad_sample_mode={mode!r} computes per-sample gradient norms without forming the "
            "per-sample gradients; use 'hooks', 'functorch' or 'ew' to see them."
        )
    return grads


def as_grad_samples(grad_samples: Mapping[str, Tensor] | list[Tensor]) -> dict[str, Tensor]:
    """A dict ``{name: [B, *shape]}`` from a dict or a list (named ``"param0"``, ``"param1"``...)."""
    if isinstance(grad_samples, Mapping):
        out = {str(k): torch.as_tensor(v).detach() for k, v in grad_samples.items()}
    else:
        out = {f"param{i}": torch.as_tensor(v).detach() for i, v in enumerate(grad_samples)}
    if not out:
        raise ValueError("grad_samples is empty: pass one [B, *shape] tensor per parameter.")
    return out


def flatten_grad_samples(grad_samples: Mapping[str, Tensor]) -> Tensor:
    """All parameters of each sample in one row: ``[B, D]``.

    >>> flatten_grad_samples({"a": torch.ones(2, 3), "b": torch.zeros(2, 1, 2), "t": torch.zeros(2)}).shape
    torch.Size([2, 6])
    """
    return torch.cat([flat_rows(g) for g in grad_samples.values()], dim=1)
