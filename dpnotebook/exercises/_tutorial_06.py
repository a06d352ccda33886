"""Checks of tutorial 06 (the modes compared): which modes handle an ``nn.EmbeddingBag``, and why the others refuse.

The answer is a set of mode names, ``works``, and a dict ``refusals`` holding, for every mode left
out of ``works``, the error that mode raised on the model (the ``error`` of its
:func:`dpnotebook.compare.compare_modes` row). The check runs ``compare_modes`` on the notebook's model
itself. Its hints never say which mode is misplaced, only how many: the set cannot be found by
guessing mode after mode, and the refusals cannot be written without running the modes.

>>> import torch
>>> from dpnotebook.exercises import judge
>>> bag = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 4, mode="mean"), torch.nn.Linear(4, 3))
>>> words, labels = torch.randint(0, 20, (4, 5)), torch.randint(0, 3, (4,))
>>> judge("06.embedding_bag_modes", {"hooks", "oracle"}, refusals={}, model=bag, inputs=words, targets=labels).hint
'"oracle" is the float64 reference every mode is compared with, not a mode: leave it out'
>>> judge("06.embedding_bag_modes", {"hooks"}, refusals={}, model=bag, inputs=words, targets=labels).hint
'2 of the 4 modes are on the wrong side: run compare_modes(bag_model, words, labels) and read every row'
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from dpnotebook.exercises._core import ExerciseFailed, pending, register_check, require

_SHOWN = 40  # the refusal must match the mode's error this far (its first words name the mode and the cause)


@register_check(
    "06.embedding_bag_modes",
    todo="guess first; then run compare_modes on bag_model, fill in works and, for each mode left out, its error",
)
def check_embedding_bag_modes(
    works: Any, model: nn.Module, inputs: Tensor, targets: Tensor, refusals: Any = None
) -> str:
    """The student's set against the modes whose ``compare_modes`` row agrees; each refusal against the mode's error."""
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
    misplaced = len(works ^ right)
    if misplaced:
        raise ExerciseFailed(
            f"{misplaced} of the {len(rows)} modes {'is' if misplaced == 1 else 'are'} on the wrong side: "
            "run compare_modes(bag_model, words, labels) and read every row"
        )
    refused = set(rows) - right
    pending(
        refusals,
        "works is right; now fill in refusals: for each mode you left out, the error it raised (its row's .error)",
    )
    require(
        isinstance(refusals, dict) and set(refusals) == refused,
        f"refusals should be a dict with one entry per mode left out of works ({len(refused)} of them), "
        "each the error that mode raised",
    )
    for mode, text in refusals.items():
        error = rows[mode].error or ""
        require(
            isinstance(text, str) and len(text.strip()) >= min(_SHOWN, len(error)) and error.startswith(text.strip()),
            f"refusals[{mode!r}] is not the start of the error that mode raised: copy its compare_modes row's .error",
        )
    return (
        f"EmbeddingBag works in {sorted(right)}; {', '.join(sorted(refused)) or 'no mode'} refuses it with an error "
        "naming the way out"
    )
