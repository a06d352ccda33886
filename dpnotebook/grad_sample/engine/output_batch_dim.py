"""Where the whole model's output holds the batch, for functorch mode's one replayed unit.

Functorch mode replays the whole model per sample, so it must split the input
*and* the output gradient by sample. The input's batch dim is the one
``batch_first`` names, but the output's need not be: a recurrent model reading
``[T, B, D]`` (``batch_first=False``) often returns ``[B, classes]`` from its
last hidden state. :func:`output_batch_dims` finds, for each output tensor, the
one dim that holds the input's ``B*K`` rows; when several dims hold that many
(``[T, B, H]`` with ``T == B``, ``[B, B]`` logits), the model is run once more,
without gradients, on one extra row, and the dim that grew is the batch dim.

>>> import torch
>>> from torch import nn
>>> class LastStep(nn.Module):      # [T, B, D] in, [B, D] out
...     def forward(self, x):
...         return x[-1] * 2
>>> x = torch.randn(3, 4, 2)
>>> output_batch_dims(LastStep(), (x,), {}, LastStep()(x), [0], rows=4, batch_dim=1)
[0]
>>> x = torch.randn(4, 4, 4)       # [B, D] out with D == B: only a second run can tell
>>> output_batch_dims(LastStep(), (x,), {}, LastStep()(x), [0], rows=4, batch_dim=1)
[0]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample.engine.functorch_fallback import capture_paused

__all__ = ["output_batch_dims", "input_rows"]


def input_rows(args: tuple, kwargs: dict, batch_dim: int) -> int | None:
    """The rows ``B*K`` of the first tensor argument with a ``batch_dim``, or ``None`` when there is none."""
    if args and isinstance(args[0], Tensor) and args[0].dim() > batch_dim:  # the usual call, checked cheaply
        return args[0].shape[batch_dim]
    leaves, _ = tree_flatten((args, kwargs))
    return next((x.shape[batch_dim] for x in leaves if isinstance(x, Tensor) and x.dim() > batch_dim), None)


def _one_row_more(tree: Any, rows: int, batch_dim: int) -> Any:
    leaves, spec = tree_flatten(tree)
    grown = [
        torch.cat([x, x.narrow(batch_dim, 0, 1)], batch_dim)
        if isinstance(x, Tensor) and x.dim() > batch_dim and x.shape[batch_dim] == rows
        else x
        for x in leaves
    ]
    return tree_unflatten(grown, spec)


def output_batch_dims(
    model: nn.Module, args: tuple, kwargs: dict, output: Any, out_index: list[int], *, rows: int, batch_dim: int
) -> list[int]:
    """For each output tensor named by ``out_index``, the dim that holds the ``rows`` rows.

    Args:
        model: the model; run once more (no gradients, one extra row per input tensor) only when an
            output tensor has several dims of size ``rows``.
        args, kwargs: its inputs, whose batch is in ``batch_dim``.
        output: ``model(*args, **kwargs)``.
        out_index: positions, in the flattened output, of the tensors that carry gradients.
        rows: the input's rows ``B*K`` (``> 0``).
        batch_dim: the input's batch dim, preferred when it alone fits.

    Raises:
        GradSampleError: an output has no dim of ``rows`` rows, or several that follow the input's rows.
    """
    leaves = [output] if isinstance(output, Tensor) else tree_flatten(output)[0]
    outputs = [leaves[i] for i in out_index]
    candidates = [[d for d, n in enumerate(t.shape) if n == rows] for t in outputs]
    if all(len(c) == 1 for c in candidates):
        return [c[0] for c in candidates]
    for t, c in zip(outputs, candidates, strict=True):
        if not c:
            raise _no_batch_dim(t, rows, batch_dim)
    with torch.no_grad(), capture_paused():
        probe = model(*_one_row_more(args, rows, batch_dim), **_one_row_more(kwargs, rows, batch_dim))
    probes = tree_flatten(probe)[0]
    dims = []
    for i, t, c in zip(out_index, outputs, candidates, strict=True):
        p = probes[i] if i < len(probes) and isinstance(probes[i], Tensor) else t
        grew = [
            d
            for d in c
            if p.dim() == t.dim()
            and p.shape[d] == rows + 1
            and p.shape[:d] + p.shape[d + 1 :] == t.shape[:d] + t.shape[d + 1 :]
        ]
        if len(grew) != 1:
            raise GradSampleError(
                f"functorch mode: the model's output of shape {tuple(t.shape)} has {len(c)} dims of the "
                f"input's {rows} rows (dims {c}), and one more input row did not tell which one holds the "
                f"batch (grew: {grew}). Fix: return the output with its batch in dim "
                f"{batch_dim} (as batch_first says for the input), or use a batch size that no other dim has."
            )
        dims.append(grew[0])
    return dims


def _no_batch_dim(t: Tensor, rows: int, batch_dim: int) -> GradSampleError:
    return GradSampleError(
        f"functorch mode: the model's output of shape {tuple(t.shape)} has no dim of the input's {rows} rows "
        f"(B*K, in input dim {batch_dim}), so its gradient cannot be split per sample. Fix: return one "
        "output row per input row (a loss over the batch belongs outside the model), and check batch_first."
    )
