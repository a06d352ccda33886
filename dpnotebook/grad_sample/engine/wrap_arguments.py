"""The arguments every grad-sample wrapper takes and checks alike: ``K`` and ``loss_reduction``."""

from __future__ import annotations

from typing import Any

LOSS_REDUCTIONS = ("mean", "sum")


def check_k(K: Any) -> int:
    """Validate the augmentation multiplicity ``K``.

    >>> check_k(0)
    Traceback (most recent call last):
    ...
    ValueError: K=0 is invalid: K is the number of augmented copies of each sample and must be an int >= 1 (K=1 means no augmentation multiplicity).
    """
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(
            f"K={K!r} is invalid: K is the number of augmented copies of each sample and must be "
            "an int >= 1 (K=1 means no augmentation multiplicity)."
        )
    return K


def check_loss_reduction(loss_reduction: Any) -> str:
    """Validate ``loss_reduction``: how the user's loss combines the batch's rows.

    >>> check_loss_reduction("avg")
    Traceback (most recent call last):
    ...
    ValueError: loss_reduction='avg' is invalid; use one of ('mean', 'sum'): 'mean' if your loss averages over the batch's rows, 'sum' if it adds them up.
    """
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss_reduction={loss_reduction!r} is invalid; use one of {LOSS_REDUCTIONS}: "
            "'mean' if your loss averages over the batch's rows, 'sum' if it adds them up."
        )
    return loss_reduction


__all__ = ["LOSS_REDUCTIONS", "check_k", "check_loss_reduction"]
