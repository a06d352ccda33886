"""Where per-sample gradients are stored, and the check that none went missing.

Within one forward pass, contributions to ``p.grad_sample`` add up (a layer called twice, tied
weights). Before ``zero_grad``, a later backward pass that brings new samples makes it a list with
one tensor per backward pass; a forward pass's samples stay in one tensor, in forward-pass order.
Everything reads it through :func:`grad_sample_rows` or :func:`grad_sample_parts`, so both forms
are handled in one place. At the end of every backward pass, a parameter that received a ``.grad``
but no per-sample gradients is refused: DP-SGD would clip the wrong thing.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import GradSampleModule
>>> model = GradSampleModule(nn.Linear(3, 1), loss_reduction="sum")
>>> for rows in (2, 5):                      # two backward passes before one step
...     model(torch.randn(rows, 3)).sum().backward()
>>> [tuple(g.shape) for g in model.weight.grad_sample]
[(2, 1, 3), (5, 1, 3)]
>>> grad_sample_rows(model.weight).shape
torch.Size([7, 1, 3])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError

#: What ``p.grad_sample`` holds: one tensor, or (after several backward passes) one tensor per pass.
GradSample = Tensor | list[Tensor]

__all__ = ["GradSample", "GradSampleStore", "carry_processed", "grad_sample_parts", "grad_sample_rows"]


def grad_sample_parts(p: Tensor) -> list[Tensor]:
    """``p.grad_sample`` as a list of tensors, one per backward pass (``[]`` when there is none).

    Raises:
        TypeError: ``p.grad_sample`` is neither a tensor nor a list of tensors.

    >>> import torch
    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> grad_sample_parts(p), len(grad_sample_parts(p)) == 0
    ([], True)
    >>> p.grad_sample = [torch.ones(3, 2), torch.ones(1, 2)]
    >>> [tuple(g.shape) for g in grad_sample_parts(p)]
    [(3, 2), (1, 2)]
    """
    found = getattr(p, "grad_sample", None)  # the wrapper's attribute: torch's Parameter does not declare it
    if found is None:
        return []
    if isinstance(found, Tensor):
        return [found]
    if isinstance(found, (list, tuple)) and all(isinstance(g, Tensor) for g in found):
        return list(found)
    raise TypeError(
        f"p.grad_sample is {type(found).__name__}, not a tensor or a list of tensors (one per backward "
        "pass): it was set by hand to something else. Fix: set p.grad_sample to a [B, *p.shape] tensor."
    )


def grad_sample_rows(p: Tensor) -> Tensor | None:
    """All of ``p.grad_sample``'s rows as one tensor (the backward passes' tensors concatenated), or ``None``.

    Raises:
        TypeError: ``p.grad_sample`` is neither a tensor nor a list of tensors.
        GradSampleError: ``p.grad_sample`` is an empty list.

    >>> import torch
    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> p.grad_sample = [torch.ones(3, 2), torch.zeros(1, 2)]
    >>> grad_sample_rows(p).sum(1).tolist()
    [2.0, 2.0, 2.0, 0.0]
    """
    parts = grad_sample_parts(p)
    if not parts:
        if getattr(p, "grad_sample", None) is not None:
            raise GradSampleError(
                "p.grad_sample is an empty list: no backward pass left per-sample gradients in it. "
                "Fix: set p.grad_sample to None (or call zero_grad()) instead of an empty list."
            )
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def carry_processed(prev: Tensor, new: Tensor) -> Tensor:
    """``new``, marked as clipped by a step (``_processed``) if ``prev``, the rows it was formed from, was.

    The next step then refuses them instead of clipping them twice.
    """
    if hasattr(prev, "_processed"):
        setattr(new, "_processed", True)  # an attribute torch's Tensor does not declare
    return new


#: One tensor of ``p.grad_sample``: the backward pass that started it and its ``(forward_id, samples)`` blocks.
_Part = tuple[int, list[tuple[int, int]]]


class GradSampleStore:
    """Stores ``p.grad_sample`` for the parameters of ``owner._module``.

    Args:
        owner: the wrapper; its ``hooks_enabled`` switches the end-of-backward check.
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self._parts: dict[int, list[_Part]] = {}
        self._backward = 0  # counts the backward passes that reached the store (the end-of-backward check)
        self._graded: set[int] = set()
        self._sampled: set[int] = set()
        self._handles: dict[int, Any] = {}
        self._check_queued = False

    @property
    def _module(self) -> nn.Module:
        return self.owner._module

    @property
    def allow_accumulation(self) -> bool:
        """The wrapper's ``allow_grad_accumulation()`` / ``forbid_grad_accumulation()``."""
        return bool(self.owner.allow_accumulation)

    def watch(self) -> None:
        """Hook each trainable parameter (on every forward pass) so the end-of-backward check sees its gradient."""
        for p in self._module.parameters():
            if p.requires_grad and id(p) not in self._handles:
                self._handles[id(p)] = p.register_post_accumulate_grad_hook(self._on_grad)

    def unwatch(self) -> None:
        for h in self._handles.values():
            h.remove()
        self._handles = {}

    def add(self, p: nn.Parameter, g: Tensor, forward_id: int) -> None:
        """Add one unit's per-sample gradients ``g`` (``[B, *p.shape]``) to ``p.grad_sample``.

        A forward pass already held adds up in its rows; another is inserted into this backward
        pass's tensor (blocks sorted by ``forward_id``), or starts a new tensor of the list.
        """
        tensors = grad_sample_parts(p)
        parts = self._parts.get(id(p), []) if tensors else []
        if tensors and [sum(n for _, n in blocks) for _, blocks in parts] != [t.shape[0] for t in tensors]:
            raise GradSampleError(
                f"{self._name(p)}: p.grad_sample holds {[t.shape[0] for t in tensors]} rows, not the rows the "
                "wrapper's backward passes left in it: it was replaced by hand between backward passes, so "
                "the rows can no longer be told apart by sample. Fix: call zero_grad() before the next "
                "backward pass, or change p.grad_sample only after the last one."
            )
        if not parts:
            tensors, parts = [g], [(self._backward, [(forward_id, g.shape[0])])]
        else:
            at = next((i for i, (_, blocks) in enumerate(parts) if any(f == forward_id for f, _ in blocks)), None)
            if at is None and parts[-1][0] != self._backward:  # a new backward pass with new samples
                self._refuse_accumulation(p)
                tensors, parts = [*tensors, g], [*parts, (self._backward, [(forward_id, g.shape[0])])]
            else:
                at = len(parts) - 1 if at is None else at
                merged = self._merge(p, tensors[at], parts[at][1], g, forward_id)
                tensors[at] = carry_processed(tensors[at], merged)
        self._parts[id(p)] = parts
        setattr(p, "grad_sample", tensors[0] if len(tensors) == 1 else tensors)
        self._sampled.add(id(p))
        self._queue_check()

    def _merge(
        self, p: nn.Parameter, prev: Tensor, blocks: list[tuple[int, int]], g: Tensor, forward_id: int
    ) -> Tensor:
        """``prev`` (rows in ``blocks``) with ``g`` added to its forward pass's rows, or inserted as a new block."""
        if len(blocks) == 1 and blocks[0][0] == forward_id and blocks[0][1] == g.shape[0]:
            return prev + g  # the usual case: one forward pass
        start = 0
        for i, (fid, n) in enumerate(blocks):  # noqa: B007 - i is the insertion point after the loop
            if fid == forward_id:
                if n != g.shape[0]:
                    raise GradSampleError(
                        f"{self._name(p)}: forward pass {forward_id} gave {g.shape[0]} per-sample gradients "
                        f"to a block of {n}; its layers saw different numbers of samples."
                    )
                return torch.cat([prev[:start], prev[start : start + n] + g, prev[start + n :]])
            if fid > forward_id:
                break
            start += n
        else:
            i = len(blocks)
        self._refuse_accumulation(p)
        blocks.insert(i, (forward_id, g.shape[0]))
        return torch.cat([prev[:start], g, prev[start:]])

    def _refuse_accumulation(self, p: nn.Parameter) -> None:
        if not self.allow_accumulation:
            raise GradSampleError(
                f"{self._name(p)} already holds grad_sample from an earlier batch and gradient "
                "accumulation is forbidden. Call zero_grad() (on the model or the DP optimizer) "
                "before the next forward/backward, or call allow_grad_accumulation()."
            )

    def blocks(self, p: nn.Parameter) -> list[tuple[int, int]]:
        """``(forward_id, number of samples)`` of each block of rows of :func:`grad_sample_rows`, in row order.

        >>> import torch
        >>> from torch import nn
        >>> from dpnotebook import GradSampleModule
        >>> model = GradSampleModule(nn.Linear(3, 1), loss_reduction="sum")
        >>> (model(torch.randn(2, 3)).sum() + model(torch.randn(5, 3)).sum()).backward()
        >>> model._store.blocks(model.weight)
        [(1, 2), (2, 5)]
        """
        if getattr(p, "grad_sample", None) is None:
            return []
        return [block for _, blocks in self._parts.get(id(p), []) for block in blocks]

    def clear(self) -> None:
        """Forget all per-sample gradients."""
        for p in self._module.parameters():
            setattr(p, "grad_sample", None)
        self._parts.clear()

    def _name(self, p: nn.Parameter) -> str:
        return next((f"parameter {n!r}" for n, q in self._module.named_parameters() if q is p), "a parameter")

    def _on_grad(self, p: nn.Parameter) -> None:
        if self.owner.hooks_enabled:
            self._graded.add(id(p))
            self._queue_check()

    def _queue_check(self) -> None:
        if not self._check_queued:
            self._check_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._check)

    def _check(self) -> None:
        missing_ids = self._graded - self._sampled
        self._check_queued = False
        self._backward += 1
        self._graded, self._sampled = set(), set()
        if missing_ids:
            missing = [n for n, p in self._module.named_parameters() if id(p) in missing_ids]
            raise GradSampleError(
                f"{len(missing)} trainable parameter(s) received .grad but no grad_sample: {missing}: used "
                "outside its module's forward (F.linear(x, self.fc.weight) in a parent, a submodule called "
                "outside the wrapped model). Call the submodule itself, register a grad sampler for the parent "
                "(dpnotebook.register_grad_sampler), or freeze the parameter."
            )
