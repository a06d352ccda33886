"""Checks of tutorial 06 (the modes compared): which modes handle an ``nn.EmbeddingBag``.

The answer is a set of mode names; the check runs :func:`dpnotebook.compare.compare_modes` on the
notebook's model itself and compares.

>>> import torch
>>> from dpnotebook.exercises import judge
>>> bag = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 4, mode="mean"), torch.nn.Linear(4, 3))
>>> words, labels = torch.randint(0, 20, (4, 5)), torch.randint(0, 3, (4,))
>>> judge("06.embedding_bag_modes", {"hooks", "oracle"}, model=bag, inputs=words, targets=labels).hint
'"oracle" is the float64 reference every mode is compared with, not a mode: leave it out'
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from dpnotebook.exercises.core import ExerciseFailed, register_check, require


@register_check("06.embedding_bag_modes", todo="run compare_modes on bag_model and keep the modes whose row agrees")
def check_embedding_bag_modes(works: Any, model: nn.Module, inputs: Tensor, targets: Tensor) -> str:
    """The student's set against the modes whose ``compare_modes`` row agrees with the oracle."""
    from dpnotebook.compare import compare_modes

    require(
        isinstance(works, (set, frozenset, list, tuple)) and all(isinstance(m, str) for m in works),
        f"works should be a set of mode names such as {{'hooks'}}; got {works!r}",
    )
    works = set(works)
    if "oracle" in works:
        raise ExerciseFailed('"oracle" is the float64 reference every mode is compared with, not a mode: leave it out')
    rows = {r.mode: r for r in compare_modes(model, inputs, targets, repeats=1) if r.mode != "oracle"}
    unknown = works - set(rows)
    require(not unknown, f"{sorted(unknown)} are not modes; dpnotebook.available_modes() lists them")
    right = {m for m, r in rows.items() if r.agrees}
    for mode in sorted(works - right):
        raise ExerciseFailed(
            f"{mode!r} does not compute this model's per-sample gradients: its row says "
            f"agrees={rows[mode].agrees}" + (f" ({rows[mode].error})" if getattr(rows[mode], "error", None) else "")
        )
    for mode in sorted(right - works):
        hint = " (ghost's row compares the per-sample norms, which is all DP-SGD needs)" if mode == "ghost" else ""
        raise ExerciseFailed(f"{mode!r} handles it too: its row agrees with the oracle{hint}")
    return f"EmbeddingBag works in {sorted(right)}; the others refuse it with an error naming the way out"
