"""The ghost criterion path (``DPLossFastGradientClipping``'s backward) under the sensitivity auditor:
each sample moves the step by at most C, and the step equals the float64 definition, on adversarial records."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpnotebook.audit import FAMILIES, RECORDS, audit_case, audit_sensitivity
from dpnotebook.privacy._optimizer import DPLossFastGradientClipping, is_wrapped


class DotLoss(nn.Module):
    """``<output, target>`` per row, reduced as ``reduction`` says (a criterion with a ``reduction``)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per_row = (output * target).flatten(1).sum(1)
        return {"none": per_row, "mean": per_row.mean(), "sum": per_row.sum()}[self.reduction]


class _Reduction:
    def __init__(self, loss_reduction: str) -> None:
        self.loss_reduction = loss_reduction


def criterion_loss(loss_reduction: str):
    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        x, t = batch
        out = model(x)
        if not is_wrapped(model):  # the auditor's float64 reference runs the plain model
            return DotLoss(loss_reduction)(out, t.to(out.dtype))
        criterion = DPLossFastGradientClipping(
            model, _Reduction(loss_reduction), DotLoss(loss_reduction), loss_reduction
        )
        return criterion(out, t.to(out.dtype))

    return loss


@pytest.mark.parametrize("family", ["mlp", "conv", "embedding"])
@pytest.mark.parametrize("K, loss_reduction", [(1, "mean"), (3, "sum")])
@pytest.mark.parametrize("C", [0.05, 50.0])
def test_ghost_criterion_path_keeps_the_bound(family: str, K: int, loss_reduction: str, C: float) -> None:
    for record in RECORDS:
        if record == "cancelling_positions" and not FAMILIES[family].sequence:
            continue
        case = audit_case(family, record)
        report = audit_sensitivity(
            case.model(True),
            batch=lambda idx, case=case: case.batch(idx, K=K, batch_first=True),
            loss=criterion_loss(loss_reduction),
            num_samples=case.num_samples,
            mode="ghost",
            K=K,
            loss_reduction=loss_reduction,
            max_grad_norm=C,
        )
        assert report.ok(), (record, report.table())
        assert report.reference_gap < 1e-4, (record, report.reference_gap)
