"""Functorch mode: per-sample gradients of the whole model at once, replayed with ``torch.func``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpnotebook.grad_sample._engine.calls import count_rows, output_batch_dims, refuse_packed, replayed_call
from dpnotebook.grad_sample._engine.hooks import GradSampleModule, plan_units
from dpnotebook.modes import register_mode


@register_mode("functorch")
class FunctorchGradSampleModule(GradSampleModule):
    """Per-sample gradients of the whole model at once with ``torch.func``.

    In the backward pass, ``vmap`` over the ``B`` samples of ``grad`` of
    ``sum_k <model(x[i, k]), backprop[i, k]>`` (in chunks of at most ``B`` rows, ``replay_chunk``).
    Any model that does not mix samples works; the output's batch dim is found
    (:func:`~dpnotebook.grad_sample._engine.calls.output_batch_dims`). A ``PackedSequence`` is refused.

    >>> class LastHidden(nn.Module):       # [T, B, D] in, [B, 2] out
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.lstm, self.fc = nn.LSTM(3, 4), nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         hidden, _ = self.lstm(x)[1]
    ...         return self.fc(hidden[-1])
    >>> model = FunctorchGradSampleModule(LastHidden(), batch_first=False, K=2)
    >>> model(torch.randn(5, 6, 3)).sum().backward()
    >>> model.fc.weight.grad_sample.shape   # B = 6 rows / K = 2
    torch.Size([3, 2, 4])
    """

    grad_sample_mode = "functorch"
    probes_rows = False  # the replay sees one sample at a time: its rows cannot be another's
    tracks_broadcasts = False  # ... and it replays the whole model: every parameter is in it

    def _plan(self) -> list[Any]:
        return plan_units(self._module, whole_model=True)

    def add_hooks(self) -> None:
        if self._hooks is None:
            super().add_hooks()  # first: it refuses a model another wrapper hooks, before any hook is added
            self._moves: dict[int, list[tuple[int, int]]] = {}  # forward id -> (output leaf, its batch dim)
            # runs before the recording hook, which then sees the output's batch where the input's is
            self._batch_hook = self._module.register_forward_hook(
                self._batch_to_input_dim, with_kwargs=True, prepend=True
            )

    def remove_hooks(self) -> None:
        if self._hooks is not None:
            self._batch_hook.remove()
        super().remove_hooks()

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        refuse_packed(args, kwargs, "functorch", self._module)
        output = super()._forward(*args, **kwargs)
        moves = self._moves.get(self._forward_id) if self._moves else None
        return _move_batch(output, moves, self._batch_dim, back=True) if moves else output

    @property
    def _batch_dim(self) -> int:
        return 0 if self.batch_first else 1

    def _batch_to_input_dim(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        """Forward hook: move each output tensor's batch dim to the input's (undone in :meth:`_forward`)."""
        call = replayed_call()
        if call is not None:
            moves = self._moves.get(call.forward_id)
        elif self._in_forward and self.hooks_enabled and torch.is_grad_enabled():
            moves = self._find_moves(module, args, kwargs, output)
            if moves or self._moves:
                if len(self._moves) > 64:  # replays come in the backward pass of recent forward passes
                    self._moves = {i: m for i, m in self._moves.items() if i > self._forward_id - 64}
                self._moves[self._forward_id] = moves
        else:
            return None
        return _move_batch(output, moves, self._batch_dim) if moves else None

    def _find_moves(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> list[tuple[int, int]]:
        bd = self._batch_dim
        rows = count_rows(args, kwargs, batch_first=bd == 0)
        leaves = [output] if isinstance(output, torch.Tensor) else tree_flatten(output)[0]
        out_index = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
        if not rows or not out_index:
            return []
        dims = output_batch_dims(module, args, kwargs, output, out_index, rows=rows, batch_dim=bd)
        return [(i, -1 if leaves[i].dim() <= bd else d) for i, d in zip(out_index, dims, strict=True) if d != bd]


def _move_batch(output: Any, moves: list[tuple[int, int]], batch_dim: int, back: bool = False) -> Any:
    """``output`` with leaf ``i``'s dim ``d`` moved to ``batch_dim`` for each ``(i, d)`` in ``moves`` (or back).

    A 1-d leaf (``[B]`` with the input's batch in dim 1) gets a leading dim of 1 instead (and loses it back).
    """
    leaves, spec = tree_flatten(output)
    for i, d in moves:
        t = leaves[i]
        if back:
            leaves[i] = t.squeeze(0) if d == -1 else t.movedim(batch_dim, d)
        else:
            leaves[i] = t.unsqueeze(0) if d == -1 else t.movedim(d, batch_dim)
    return tree_unflatten(leaves, spec)
