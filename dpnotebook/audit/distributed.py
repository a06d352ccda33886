"""The sensitivity auditor across ranks: one sample moves the *all-reduced* clipped sum by at most ``C``.

Run it in every process of a ``torch.distributed`` group. Sample ``i`` of the
audited batch ``D`` lives on rank ``i % world_size``, as the distributed sampler
places it. For ``D`` and for every ``D`` without ``s``, each rank clips its own
samples with the library's distributed DP optimizer (σ = 0) and the all-reduce
gives ``S``; the report is the one :func:`~dpnotebook.audit.audit_sensitivity`
makes, the same on every rank. ``reference_gap`` compares the all-reduced
``S(D)`` with each sample's float64 gradient clipped in one process: a rank
whose sum were lost or counted twice shows there, even where the per-sample
ratios stay below 1.

>>> audit_sensitivity_across_ranks.__name__    # needs a process group; see tests/distributed
'audit_sensitivity_across_ranks'
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dpnotebook.audit.sensitivity import (
    LossOf,
    MakeBatch,
    SensitivityReport,
    measure,
    optimizer_class_for,
)
from dpnotebook.modes import wrap_model
from dpnotebook.privacy import unwrap_model
from dpnotebook.privacy._optimizer import as_wrapper
from dpnotebook.testing import clean_copy

__all__ = ["audit_sensitivity_across_ranks"]


def audit_sensitivity_across_ranks(
    model: nn.Module,
    *,
    batch: MakeBatch,
    loss: LossOf,
    num_samples: int,
    mode: str = "hooks",
    K: int = 1,
    loss_reduction: str = "mean",
    batch_first: bool = True,
    clipping: str = "flat",
    max_grad_norm: float = 1.0,
    reference: bool = True,
) -> SensitivityReport:
    """``max_s ||S(D) - S(D without s)|| / C`` with each rank clipping its share and the sums all-reduced.

    Arguments as :func:`~dpnotebook.audit.audit_sensitivity`; ``model`` must be the
    same on every rank and ``batch(indices)`` takes global sample indices (it may
    get an empty list: a rank with no sample of the subset).
    """
    from dpnotebook.privacy.distributed import distributed_optimizer_class

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("audit_sensitivity_across_ranks needs torch.distributed initialised in every rank.")
    rank, world = dist.get_rank(), dist.get_world_size()
    setting = dict(
        mode=mode,
        K=K,
        loss_reduction=loss_reduction,
        batch_first=batch_first,
        clipping=clipping,
        C=max_grad_norm,
        world_size=world,
    )
    wrapped = wrap_model(clean_copy(model), mode, K=K, batch_first=batch_first, loss_reduction=loss_reduction)
    as_wrapper(wrapped).allow_grad_accumulation()
    params = [p for p in unwrap_model(wrapped).parameters() if p.requires_grad]
    optimizer = distributed_optimizer_class(optimizer_class_for(wrapped))(
        torch.optim.SGD(params, lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=max_grad_norm,
        expected_batch_size=1.0,
        loss_reduction=loss_reduction,
        clipping=clipping,
        secure_mode=False,
    )
    report = SensitivityReport(setting)

    def local(indices: list[int]) -> list:
        return [batch([i for i in indices if i % world == rank])]

    return measure(
        report,
        wrapped,
        optimizer,
        loss,
        local,
        model=model,
        num_samples=num_samples,
        C=max_grad_norm,
        reference=reference,
        batch=batch,
        K=K,
        loss_reduction=loss_reduction,
        clipping=clipping,
        max_grad_norm=max_grad_norm,
    )
