"""Opacus' ``utils.per_sample_gradients_utils``: ``check_per_sample_gradients_are_correct``.

It compares a mode's ``grad_sample`` with dpnotebook's float64 microbatching oracle
(:func:`dpnotebook.testing.reference_grad_samples`) for both loss reductions. Opacus'
``grad_sample.utils`` (``wrap_model``, ``get_gsm_class``, ``register_grad_sampler``) is
:mod:`dpnotebook.grad_sample.utils`, beside the mode registry it reads.

>>> import torch
>>> from torch import nn
>>> check_per_sample_gradients_are_correct(torch.randn(6, 3, 4), nn.Linear(4, 2))
True
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.utils import wrap_model
from dpnotebook.testing import _to64, clean_copy, random_target, reference_grad_samples, wrapped_grad_samples

__all__ = ["check_per_sample_gradients_are_correct"]


def check_per_sample_gradients_are_correct(
    x: Tensor,
    module: nn.Module,
    *,
    batch_first: bool = True,
    atol: float = 10e-6,
    rtol: float = 10e-5,
    grad_sample_mode: str = "hooks",
) -> bool:
    """``True`` when ``grad_sample_mode``'s per-sample gradients of ``module`` on ``x`` match the oracle.

    Args:
        x: a batch (rows in dim 0, or dim 1 with ``batch_first=False``).
        module: the model; it is copied, never changed. The loss is ``<module(x), t>``
            for a seeded random ``t``, summed or averaged over the rows.
        batch_first: rows in dim 0 (``True``) or dim 1.
        atol, rtol: as in ``torch.allclose``.
        grad_sample_mode: ``"hooks"``, ``"functorch"`` or ``"ew"`` (ghost mode forms no
            per-sample gradients; a ``ValueError`` says so).
    """
    if grad_sample_mode == "ghost":
        raise ValueError(
            "grad_sample_mode='ghost' forms per-sample gradient norms, not p.grad_sample. Fix: check "
            "'hooks' (whose samplers ghost mode shares), or use dpnotebook.audit.audit_sensitivity for ghost."
        )
    ref = reference_grad_samples(module, [x], batch_first=batch_first)
    target = random_target(clean_copy(module).to(torch.float64), (_to64(x),))
    for reduction in ("sum", "mean"):

        def factory(m: nn.Module, reduction: str = reduction) -> nn.Module:
            return wrap_model(m, grad_sample_mode, batch_first=batch_first, loss_reduction=reduction)

        got = wrapped_grad_samples(
            factory, clean_copy(module), [x], target, loss_reduction=reduction, batch_first=batch_first
        )
        for name, expected in ref.items():
            g = got.get(name)
            if g is None or g.shape != expected.shape:
                return False
            if not torch.allclose(g.to(torch.float64), expected, atol=atol, rtol=rtol):
                return False
    return True
