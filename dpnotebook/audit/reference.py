"""The definition the sensitivity auditor checks the library against: ``S_ref(D)``.

``S_ref`` is the clipped sum computed the slow, obvious way: each sample's
gradient taken alone (its ``K`` rows and nothing else), in float64, on the plain
model, then clipped and summed by :func:`~dpnotebook.privacy.clip_and_sum`.
No grad sampler, wrapper or row bookkeeping is involved, so a per-sample gradient
that misses part of a sample's gradient, or counts a layer twice, shows up as a
gap between ``S(D)`` and ``S_ref(D)`` (:attr:`~dpnotebook.audit.sensitivity.SensitivityReport.reference_gap`).

>>> import torch
>>> from torch import nn
>>> data = torch.randn(3, 2)
>>> ref = reference_clipped_sum(
...     nn.Linear(2, 1), batch=lambda idx: data[idx], loss=lambda model, x: model(x).sum(),
...     num_samples=3, K=1, loss_reduction="sum", clipping="flat", max_grad_norm=1e6)
>>> [r.dtype for r in ref], torch.allclose(ref[1], torch.tensor([3.0], dtype=torch.float64))
([torch.float64, torch.float64], True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.testing import clean_copy

__all__ = ["reference_clipped_sum", "MakeBatch", "LossOf"]

#: ``batch(indices)``: the batch holding those samples (each sample's ``K`` rows, sample-major).
MakeBatch = Callable[[list[int]], Any]
#: ``loss(model, batch)``: the loss to call ``backward()`` on.
LossOf = Callable[[nn.Module, Any], Tensor]


def _to64(batch: Any) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(torch.float64) if batch.is_floating_point() else batch
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to64(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _to64(v) for k, v in batch.items()}
    return batch


def reference_clipped_sum(
    model: nn.Module,
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    K: int,
    loss_reduction: str,
    clipping: str,
    max_grad_norm: float | list[float],
) -> list[Tensor]:
    """``S_ref(D)``: every sample's gradient on its own (its ``K`` rows alone), in float64, clipped and summed.

    A sample's gradient is the mean over its copies of each copy's own loss
    gradient: the gradient of ``loss`` on the sample's rows, divided by ``K``
    for ``loss_reduction="sum"``. Returns one tensor per trainable parameter of
    ``model``, in order.
    """
    from dpnotebook.privacy import clip_and_sum

    plain = clean_copy(model).to(torch.float64)
    params = [p for p in plain.parameters() if p.requires_grad]
    per_sample: list[list[Tensor]] = [[] for _ in params]
    for i in range(num_samples):
        value = loss(plain, _to64(batch([i])))
        grads = torch.autograd.grad(value, params, allow_unused=True)
        for rows, p, g in zip(per_sample, params, grads, strict=True):
            g = torch.zeros_like(p) if g is None else g
            rows.append(g / K if loss_reduction == "sum" else g)
    if not num_samples:
        return [torch.zeros_like(p) for p in params]
    stacked = [torch.stack(rows) for rows in per_sample]
    return clip_and_sum(stacked, max_grad_norm=max_grad_norm, clipping=clipping).summed
