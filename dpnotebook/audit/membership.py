"""Membership inference on a trained model: was this record in the training set?

Two attacks, both black-box (they need only the model's loss on a record):

* :func:`loss_threshold_attack` (Yeom et al. 2018): a model fits its training records better
  than others, so a *low loss* says "member"; the score is ``-loss``.
* :func:`calibrated_attack` (per-example difficulty calibration, Watson et al. 2022): some
  records are hard for any model, some easy; subtracting the loss that *reference models*
  trained without the record give it, ``score = reference loss - target loss``, leaves what
  training on the record added.

Both return an :class:`~dpnotebook.audit.roc.AttackROC` (ROC curve, AUC, advantage, TPR at a
low FPR). :func:`sliced_attack` splits an attack's results by a group (a class, say): an attack
that does little on average may do well on one group. Differential privacy bounds every such attack: see :mod:`dpnotebook.audit.tradeoff`.

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> model = nn.Linear(4, 2)
>>> x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])
>>> example_losses(model, x, y).shape
torch.Size([6])
>>> roc = loss_threshold_attack(model, (x[:3], y[:3]), (x[3:], y[3:]))
>>> 0.0 <= roc.advantage <= 1.0
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from dpnotebook.audit.roc import AttackROC, attack_roc

__all__ = ["example_losses", "loss_threshold_attack", "calibrated_attack", "sliced_attack"]

Records = tuple[Tensor, Tensor]


def _cross_entropy(output: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(output, target, reduction="none")


def example_losses(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = _cross_entropy,
    batch_size: int = 1024,
) -> Tensor:
    """One loss per record, in eval mode and without gradients (float64 on the CPU).

    Args:
        model: the trained model (a wrapped one works too).
        inputs, targets: the records, first dimension = records.
        loss_fn: ``loss_fn(output, targets)`` with ``reduction="none"``: one value per record
            (default: cross-entropy).
        batch_size: records per forward pass.
    """
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs has {inputs.shape[0]} records but targets has {targets.shape[0]}: pass one target per input."
        )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = [
                loss_fn(model(inputs[i : i + batch_size]), targets[i : i + batch_size])
                for i in range(0, inputs.shape[0], batch_size)
            ]
    finally:
        model.train(was_training)
    losses = torch.cat([o.reshape(-1) for o in out]).detach().double().cpu() if out else torch.zeros(0)
    if losses.shape != (inputs.shape[0],):
        raise ValueError(
            f"loss_fn returned shape {tuple(losses.shape)} for {inputs.shape[0]} records: it must give "
            "one loss per record (reduction='none')."
        )
    return losses


def loss_threshold_attack(
    model: nn.Module,
    members: Records,
    nonmembers: Records,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = _cross_entropy,
) -> AttackROC:
    """Score each record by ``-loss`` under ``model``: members should score higher.

    Args:
        model: the target model.
        members: ``(inputs, targets)`` it was trained on.
        nonmembers: ``(inputs, targets)`` from the same distribution it was not trained on.
        loss_fn: per-record loss, see :func:`example_losses`.
    """
    return attack_roc(
        -example_losses(model, *members, loss_fn=loss_fn).numpy(),
        -example_losses(model, *nonmembers, loss_fn=loss_fn).numpy(),
    )


def calibrated_attack(
    model: nn.Module,
    reference_models: Sequence[nn.Module],
    members: Records,
    nonmembers: Records,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = _cross_entropy,
) -> AttackROC:
    """Score each record by how much lower its loss is under ``model`` than under reference models.

    ``score(x) = mean over reference models of loss_ref(x) - loss_target(x)``. The reference
    models are trained like the target on data from the same distribution that holds none of
    the records scored; they tell how hard each record is anyway.

    Args:
        model: the target model.
        reference_models: one or more models trained without any of the scored records.
        members, nonmembers: see :func:`loss_threshold_attack`.
        loss_fn: per-record loss, see :func:`example_losses`.

    >>> from torch import nn
    >>> m = nn.Linear(2, 2)
    >>> r = calibrated_attack(m, [m], (torch.ones(2, 2), torch.zeros(2, dtype=torch.long)),
    ...                       (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)))
    >>> r.member_scores.tolist()                          # the target is its own reference: nothing left
    [0.0, 0.0]
    """
    if len(reference_models) == 0:
        raise ValueError("reference_models is empty: pass at least one model trained without the scored records.")

    def scores(records: Records) -> Tensor:
        target = example_losses(model, *records, loss_fn=loss_fn)
        reference = torch.stack([example_losses(r, *records, loss_fn=loss_fn) for r in reference_models]).mean(0)
        return reference - target

    return attack_roc(scores(members).numpy(), scores(nonmembers).numpy())


def sliced_attack(roc: AttackROC, member_groups: object, nonmember_groups: object) -> dict[int, AttackROC]:
    """The same attack's scores, one ROC per group (e.g. per class label).

    Each group holds fewer records than the whole, so its advantage is noisier: compare it with
    :func:`~dpnotebook.audit.roc.advantage_noise_floor` of that group, not of the whole.

    Args:
        roc: an attack's result (its member and non-member scores are sliced).
        member_groups, nonmember_groups: one integer group per member and per non-member, in the
            order of ``roc.member_scores`` and ``roc.nonmember_scores``.

    >>> roc = attack_roc([3.0, 2.0, 1.0, 0.5], [1.0, 0.0, 2.5, 0.2])
    >>> {g: r.advantage for g, r in sliced_attack(roc, [0, 0, 1, 1], [0, 0, 1, 1]).items()}
    {0: 1.0, 1: 0.5}
    """
    mg = np.asarray(member_groups).reshape(-1)
    ng = np.asarray(nonmember_groups).reshape(-1)
    if mg.shape != roc.member_scores.shape or ng.shape != roc.nonmember_scores.shape:
        raise ValueError(
            f"{mg.size} member groups for {roc.member_scores.size} members and {ng.size} non-member groups for "
            f"{roc.nonmember_scores.size} non-members: pass one group per scored record, in the same order."
        )
    groups = sorted(set(mg.tolist()) & set(ng.tolist()))
    if not groups:
        raise ValueError("no group has both members and non-members: nothing to compare within a group.")
    return {int(g): attack_roc(roc.member_scores[mg == g], roc.nonmember_scores[ng == g]) for g in groups}
