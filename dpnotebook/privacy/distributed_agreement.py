"""Distributed ranks agree: every rank's ``make_private`` sets up the same run, or every rank refuses.

DP-SGD on several ranks is one run only if every rank samples at the same ``q``
from the same ``N`` for the same number of steps, clips at the same ``C``, adds
noise for the same ``sigma``, in the same mode with the same ``K``, and counts with
the same accountant. :func:`check_ranks_agree` checks it with one collective.

>>> rank_disagreements([{"sigma": 1.0}, {"sigma": 1.0}, {"sigma": 2.0}])
['sigma: ranks 0, 1: 1.0, rank 2: 2.0']
"""

from __future__ import annotations

from typing import Any, cast

import torch.distributed as dist

__all__ = ["check_ranks_agree", "rank_disagreements"]


def rank_disagreements(settings_by_rank: list[dict[str, Any]]) -> list[str]:
    """One line per setting on which the ranks differ, naming each rank's value (none if they agree).

    >>> rank_disagreements([{"q": 0.5, "K": 1}, {"q": 0.25, "K": 1}])
    ['q: rank 0: 0.5, rank 1: 0.25']
    >>> rank_disagreements([{"q": 0.5}, {"q": 0.5}])
    []
    """
    lines = []
    for name in settings_by_rank[0]:
        values = [settings.get(name) for settings in settings_by_rank]
        if any(v != values[0] for v in values):
            groups: dict[str, list[int]] = {}
            for rank, value in enumerate(values):
                groups.setdefault(repr(value), []).append(rank)
            shown = ", ".join(
                f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {v}" for v, r in groups.items()
            )
            lines.append(f"{name}: {shown}")
    return lines


def check_ranks_agree(**settings: Any) -> None:
    """Refuse, on every rank, a distributed ``make_private`` whose ranks set up different runs.

    One ``all_gather_object`` of ``settings`` (``make_private`` passes the sample rate ``q``,
    the dataset size ``N``, the steps per epoch, sigma, C, the clipping, the mode, ``K``, the
    loss reduction and the accountant). Every rank receives every rank's values, so either
    all ranks return or all raise the same error: a mismatch never leaves one rank waiting in
    the first step's all-reduce. Ranks that disagreed used to train silently: per-rank loaders of
    batch sizes 4 and 12 over 24 examples sampled at q = 1/6 and 1/2, rank 0 reported epsilon 4.26
    while rank 1's examples spent 8.1, and each rank divided the same noisy sum by its own ``q N``.

    Raises:
        ValueError: the ranks differ; the message names every setting, rank and value.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "check_ranks_agree needs torch.distributed initialised. Fix: call "
            "torch.distributed.init_process_group(...) in every process first."
        )
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, settings)
    lines = rank_disagreements(cast(list[dict[str, Any]], gathered))
    if lines:
        raise ValueError(
            "the ranks of this distributed run called make_private with different settings:\n  "
            + "\n  ".join(lines)
            + "\nEach rank would sample its examples at its own q and scale the shared noisy sum by its own "
            "q*N: the epsilon one rank reports would not bound what another rank's examples spent, and the "
            "replicas would drift apart. Fix: give every rank the same data_loader (the whole dataset with "
            "the global batch size, or a DistributedSampler of the same per-rank batch size on every rank), "
            "noise_multiplier, max_grad_norm, clipping, grad_sample_mode, K, loss_reduction and accountant."
        )
