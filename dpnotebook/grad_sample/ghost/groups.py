"""How ghost mode handles each layer type: norms and weighted sums from activations and backprops.

A *group* gathers every call of one layer in one forward pass (a layer may be
called more than once: its per-sample gradient is then the sum over the calls,
and norms do not add up over calls, so the calls are joined first). Each group
answers two questions:

* :meth:`GhostGroup.sq_norms`: every sample's squared gradient norm, per parameter;
* :meth:`GhostGroup.weighted_sums`: ``sum_b w_b * (sample b's gradient)`` per
  parameter, for the clip factors ``w`` (book-keeping: no second backward).

How each layer type is handled (the norm samplers registered in
:mod:`~dpnotebook.grad_sample.ghost.registry`, looked up by its :func:`~dpnotebook.grad_sample.ghost.registry.ghost_handler`):

* ``nn.Linear``, ``InProjection`` (of ``DPMultiheadAttention``) and ``nn.Embedding``:
  :mod:`~dpnotebook.grad_sample.samplers.linear_norm`;
* ``GateProjection`` (of ``DPLSTM`` and co.): :mod:`~dpnotebook.grad_sample.samplers.rnn_norm`;
* convolutions: :mod:`~dpnotebook.grad_sample.samplers.conv_norm`;
* norm layers: :mod:`~dpnotebook.grad_sample.samplers.materialised_norm`, materialised with the
  layer's registered grad sampler, then norms and ``tensordot``. Their per-sample gradients are small next to
  their activations (one entry per channel).

Groups that hold per-sample gradients (convolutions, norm layers) add up over
calls, so ghost mode makes them call by call, as each call's backprops arrive,
and lets go of that call's inputs and backprops (:attr:`GhostHandler.materialises`).
A linear or recurrent layer over long sequences (or many copies ``K``) is
settled the same way when forming its per-sample gradients is the cheaper whole
path (:attr:`GhostHandler.settles`; for a linear layer
:func:`~dpnotebook.grad_sample.samplers.linear_map_norms.settle_pays`): the Gram
path's norms cost ``n^2 (in + out)`` per sample and its clipped sum then still
costs a product over the activations and backprops as large as forming the
per-sample gradients, whereas kept per-sample gradients make the clipped sum
one small product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, cast

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.calls import LayerCall
from dpnotebook.grad_sample._engine.layer_hooks import bound_arguments, sampler_grad_samples, to_batch_first
from dpnotebook.grad_sample._registry import find_grad_sampler
from dpnotebook.grad_sample.samplers.sample_rows import flat_rows

Grads = dict[nn.Parameter, Tensor]


class Scratch(Protocol):
    """``scratch(key, shape, like)``: a buffer the caller keeps between steps (contents undefined)."""

    def __call__(self, key: tuple, shape: tuple, like: Tensor) -> Tensor: ...


@dataclass
class GhostCall:
    """One recorded call: the layer's inputs, and (after backward) its output's gradient.

    Attributes:
        call: what the forward pass saw (as the hooks engine records it).
        backprops: gradient of the loss w.r.t. the output, batch-first, ``B*K`` rows.
        scale: undoes the loss reduction and averages over K (``rows/K`` for a mean, ``1/K`` for a sum).
    """

    call: LayerCall
    backprops: Tensor | None = None
    scale: float = 1.0

    @property
    def released(self) -> bool:
        """Its per-sample gradients were formed and its inputs and backprops let go."""
        return self.call.released

    def release(self) -> None:
        """Let go of the inputs and backprops (after the call's per-sample gradients were formed)."""
        self.call.release()
        self.backprops = None

    def received(self) -> Tensor:
        """:attr:`backprops`, once they arrived: groups are made only of calls that received theirs."""
        assert self.backprops is not None, f"{self.call.path}: no backprops received yet"
        return self.backprops

    def activations(self) -> list:
        return [
            to_batch_first(a, self.call.batch_dim)
            for a in bound_arguments(self.call.module, self.call.args, self.call.kwargs)
        ]


class GhostGroup:
    """All calls of one layer in one forward pass (see the module docstring)."""

    how = "materialised"

    def sq_norms(self) -> Grads:
        raise NotImplementedError

    def weighted_sums(self, weights: Grads) -> Grads:
        raise NotImplementedError

    def drop(self, keep: Tensor) -> None:
        """Zero every record of the samples where ``keep`` (``[B]`` bools) is False.

        A sample with clip factor 0 (a non-finite norm) must add nothing; but
        ``0 * nan`` is ``nan``, so its rows are masked, not only its weight.
        """
        raise NotImplementedError


def keep_rows(x: Tensor, keep: Tensor) -> Tensor:
    """``x`` (``[B, ...]``) with the rows where ``keep`` is False set to 0 (even NaN or inf ones).

    >>> keep_rows(torch.tensor([[1.0], [float("nan")]]), torch.tensor([True, False])).flatten().tolist()
    [1.0, 0.0]
    """
    return torch.where(keep.view(-1, *[1] * (x.dim() - 1)), x, x.new_zeros(()))


class MaterialisedGroup(GhostGroup):
    """Per-sample gradients held in full (``{p: [B, *p.shape]}``), each multiplied by ``scale`` when used.

    The registered sampler's gradients (summed over calls), a convolution's, and
    the ``p.grad_sample`` of layers left to the hooks engine all take this form.
    """

    def __init__(self, grads: Grads, scale: float = 1.0) -> None:
        self.grads, self.scale = grads, scale

    def sq_norms(self) -> Grads:
        return {p: torch.linalg.vector_norm(flat_rows(g), dim=1).pow(2) * self.scale**2 for p, g in self.grads.items()}

    def weighted_sums(self, weights: Grads) -> Grads:
        return {
            p: (weights[p].to(g.dtype) * self.scale @ flat_rows(g)).view(p.shape)
            for p, g in self.grads.items()
            if p in weights
        }

    def drop(self, keep: Tensor) -> None:
        self.grads = {p: keep_rows(g, keep) for p, g in self.grads.items()}

    def absorb(self, other: MaterialisedGroup) -> None:
        """Add the per-sample gradients of ``other`` (another call of the layer, same samples) into these.

        >>> w = nn.Parameter(torch.zeros(2))
        >>> a, b = MaterialisedGroup({w: torch.ones(3, 2)}, 0.5), MaterialisedGroup({w: torch.ones(3, 2)}, 0.5)
        >>> a.absorb(b); a.grads[w][0].tolist()
        [2.0, 2.0]
        """
        if other.scale != self.scale:
            raise GradSampleError(
                f"calls of one forward pass were scaled differently ({self.scale} and {other.scale})."
            )
        for p, g in other.grads.items():
            self.grads[p] = self.grads[p].add_(g) if p in self.grads else g


def materialise(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> MaterialisedGroup:
    """The registered sampler's per-sample gradients of ``module``, summed over ``calls``."""
    entry = find_grad_sampler(module)
    assert entry is not None, module  # layers without a grad sampler are left to the hooks engine
    total: Grads = {}
    for c in calls:
        bd, bp = c.call.batch_dim, c.received()
        bp = (
            bp.movedim(0, bd) if bd != 0 and bp.dim() > bd else bp
        )  # back to the layer's layout, as the sampler expects
        for p, g in sampler_grad_samples(entry, c.call, bp, K, c.scale * K).items():
            total[p] = total[p] + g if p in total else g
    return MaterialisedGroup(total)


GroupMaker = Callable[[nn.Module, list[GhostCall], int, Scratch], GhostGroup]


class GhostHandler(NamedTuple):
    """How ghost mode treats one kind of layer.

    Attributes:
        make_group: builds the layer's :class:`GhostGroup` from its calls in one forward pass.
        outside: names of parameters the layer's owner also uses outside its forward (an RNN's recurrence).
        materialises: its groups hold per-sample gradients (a :class:`MaterialisedGroup`), which add up
            over calls; so ghost mode makes one per call as soon as the call's backprops arrive and lets
            go of the call's inputs and backprops (memory then grows with B, not with the B*K rows).
        settles: for a layer that does not always materialise, ``settles(module, call, K)`` says whether
            forming this call's per-sample gradients is the cheaper path to its norms and clipped sum (the
            cost rule of :func:`~dpnotebook.grad_sample.samplers.linear_map_norms.settle_pays`); if so the call
            is settled as above, with the layer's registered grad sampler.
    """

    make_group: GroupMaker
    outside: tuple[str, ...] = ()
    materialises: bool = False
    settles: Callable[[nn.Module, GhostCall, int], bool] | None = None

    def settles_call(self, module: nn.Module, call: GhostCall, K: int) -> bool:
        """Whether ``call`` is settled (made into per-sample gradients) as soon as its backprops arrive."""
        return self.materialises or (self.settles is not None and self.settles(module, call, K))

    def settled_group(self, module: nn.Module, call: GhostCall, K: int, scratch: Scratch) -> MaterialisedGroup:
        """The per-sample gradients of one settled call."""
        if self.materialises:
            return cast(MaterialisedGroup, self.make_group(module, [call], K, scratch))  # it materialises
        group = materialise(module, [call], K)
        group.how = "materialised (direct)"
        return group


__all__ = ["GhostCall", "GhostGroup", "keep_rows", "MaterialisedGroup", "GhostHandler", "materialise"]
