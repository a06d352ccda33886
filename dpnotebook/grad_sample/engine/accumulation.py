"""Where per-sample gradients are stored, and the check that none went missing.

``p.grad_sample`` collects what every unit contributes in one backward pass.
Within one forward pass, contributions add up (a layer called twice, tied
weights). A later forward pass brings new samples: before ``zero_grad`` they
are appended (concatenated along the sample dim) or refused, as the wrapper says.
Rows are kept in forward-pass order whatever order backward delivers them in
(with two forward passes before one backward, it can reach them in a different
order for each layer): :meth:`GradSampleStore.blocks` lists them.

Rows a DP step already clipped carry the step's mark (``_processed``,
:mod:`~dpnotebook.privacy.step_invariants`); a gradient added to them keeps it
(:func:`carry_processed`), so that the next step refuses them instead of clipping them twice.

At the end of every backward pass, each parameter that received a ``.grad``
must also have received per-sample gradients, or we raise: a silently missing
``grad_sample`` would make DP-SGD clip the wrong thing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError


def carry_processed(prev: Tensor, new: Tensor) -> Tensor:
    """``new``, marked as clipped by a step if ``prev`` (the rows it was formed from) was."""
    if hasattr(prev, "_processed"):
        setattr(new, "_processed", True)  # an attribute torch's Tensor does not declare
    return new


class GradSampleStore:
    """Stores ``p.grad_sample`` for the parameters of ``owner._module``.

    Args:
        owner: the wrapper; its ``hooks_enabled`` switches the end-of-backward check.
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.allow_accumulation = True
        self._blocks: dict[int, list[tuple[int, int]]] = {}
        self._graded: set[int] = set()
        self._sampled: set[int] = set()
        self._handles: dict[int, Any] = {}
        self._check_queued = False

    @property
    def _module(self) -> nn.Module:
        return self.owner._module

    def watch(self) -> None:
        """Hook each trainable parameter so the end-of-backward check knows which ones got a gradient.

        Called on every forward pass, so parameters unfrozen after wrapping are watched too.
        """
        for p in self._module.parameters():
            if p.requires_grad and id(p) not in self._handles:
                self._handles[id(p)] = p.register_post_accumulate_grad_hook(self._on_grad)

    def unwatch(self) -> None:
        for h in self._handles.values():
            h.remove()
        self._handles = {}

    def add(self, p: nn.Parameter, g: Tensor, forward_id: int) -> None:
        """Add one unit's per-sample gradients ``g`` (``[B, *p.shape]``) to ``p.grad_sample``.

        Gradients of the same forward pass add up; another forward pass's are
        inserted as a new block of rows, blocks sorted by ``forward_id``.
        """
        # ``grad_sample`` is the wrapper's attribute: torch's Parameter does not declare it
        prev: Tensor | None = getattr(p, "grad_sample", None)
        blocks = self._blocks.get(id(p)) if prev is not None else None
        if prev is None or not blocks:
            setattr(p, "grad_sample", g)
            self._blocks[id(p)] = [(forward_id, g.shape[0])]
        elif blocks[-1][0] == forward_id and len(blocks) == 1:  # the usual case: one forward pass
            setattr(p, "grad_sample", carry_processed(prev, prev + g))
        else:
            setattr(p, "grad_sample", carry_processed(prev, self._merge(p, prev, blocks, g, forward_id)))
        self._sampled.add(id(p))
        self._queue_check()

    def _merge(
        self, p: nn.Parameter, prev: Tensor, blocks: list[tuple[int, int]], g: Tensor, forward_id: int
    ) -> Tensor:
        start = 0
        for i, (fid, n) in enumerate(blocks):
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
        if not self.allow_accumulation:
            raise GradSampleError(
                f"{self._name(p)} already holds grad_sample from an earlier batch and gradient "
                "accumulation is forbidden. Call zero_grad() (on the model or the DP optimizer) "
                "before the next forward/backward, or call allow_grad_accumulation()."
            )
        blocks.insert(i, (forward_id, g.shape[0]))
        return torch.cat([prev[:start], g, prev[start:]])

    def blocks(self, p: nn.Parameter) -> list[tuple[int, int]]:
        """``(forward_id, number of samples)`` of each block of rows of ``p.grad_sample``, in row order.

        >>> import torch
        >>> from torch import nn
        >>> from dpnotebook import GradSampleModule
        >>> model = GradSampleModule(nn.Linear(3, 1), loss_reduction="sum")
        >>> (model(torch.randn(2, 3)).sum() + model(torch.randn(5, 3)).sum()).backward()
        >>> model._store.blocks(model.weight)
        [(1, 2), (2, 5)]
        """
        return list(self._blocks.get(id(p), [])) if getattr(p, "grad_sample", None) is not None else []

    def clear(self, *, delete: bool = False) -> None:
        """Forget all per-sample gradients (``delete`` removes the attribute itself)."""
        for p in self._module.parameters():
            if delete:
                if hasattr(p, "grad_sample"):
                    del p.grad_sample
            else:
                setattr(p, "grad_sample", None)
        self._blocks.clear()

    def _name(self, p: nn.Parameter) -> str:
        for name, q in self._module.named_parameters():
            if q is p:
                return f"parameter {name!r}"
        return "a parameter"

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
        self._graded, self._sampled = set(), set()
        if not missing_ids:
            return
        missing = [n for n, p in self._module.named_parameters() if id(p) in missing_ids]
        raise GradSampleError(
            f"{len(missing)} trainable parameter(s) received .grad but no grad_sample: {missing}. "
            "This happens when a parameter is used outside its module's forward (e.g. "
            "F.linear(x, self.fc.weight) in a parent, or a submodule called outside the wrapped "
            "model). Call the submodule itself inside the model's forward, give the parent a "
            "grad sampler (dpnotebook.register_grad_sampler), or freeze the parameter "
            "(requires_grad=False)."
        )
