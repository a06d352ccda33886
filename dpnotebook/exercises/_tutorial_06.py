"""Checks of tutorial 06 (the modes compared): which modes handle an ``nn.EmbeddingBag``, and each refusal.

The hints say how many modes are misplaced, never which, so the set cannot be found by guessing.
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
