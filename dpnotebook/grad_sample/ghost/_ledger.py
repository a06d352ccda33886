"""The ghost records of a batch, and what they add up to: norms and clipped sums.

A :class:`GhostLedger` keeps the wrapper's records (one ``GhostCall`` per call of a ghosted
layer), forward pass by forward pass, groups each pass's calls by layer (a ``GhostGroup``; a
call whose group holds per-sample gradients is *settled* as its backprops arrive), then adds
up each sample's squared norms and the weighted sums ``Σ_b w_b g_b``: a sample is in exactly
one forward pass, while the hooks engine's ``p.grad_sample`` (``sampled``) covers all in order.

>>> from dpnotebook.grad_sample import GhostGradSampleModule
>>> model = GhostGradSampleModule(nn.Linear(3, 2))
>>> model.allow_grad_accumulation()
>>> for rows in (4, 5):                     # two forward passes before one step
...     model(torch.randn(rows, 3)).sum().backward()
>>> [B for B, _ in model._ledger.groups().values()], model._ledger.layout({})
([4, 5], [(1, 4), (2, 5)])
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.capturable import buffers_kept
from dpnotebook.grad_sample._engine.precision import exact_float32
from dpnotebook.grad_sample.samplers._contracts import (
    GhostCall,
    GhostGroup,
    GhostHandler,
    Grads,
    MaterialisedGroup,
    materialise,
)

#: ``{forward_id: (samples, {layer: group})}``, in the order the forward passes ran.
Groups = dict[int, tuple[int, dict[nn.Module, GhostGroup]]]
#: ``{p: [(forward_id, samples), ...]}``: the blocks of rows of each ``p.grad_sample`` (the hooks engine's store).
Blocks = dict[nn.Parameter, list[tuple[int, int]]]


def _dropped(weights: Tensor | Grads) -> Tensor | None:
    """``[B]``: samples some weight drops (0, or not finite), or ``None``; their records are zeroed (``0 * nan``).

    >>> _dropped(torch.tensor([1.0, 0.5])) is None, _dropped(torch.tensor([0.0, float("nan"), 1.0])).tolist()
    (True, [True, True, False])
    """
    ws = list({id(w): w for w in weights.values()}.values()) if isinstance(weights, dict) else [weights]
    bad = [~(torch.isfinite(w) & (w != 0)) for w in ws]
    if not bad or not bool(torch.stack([b.any() for b in bad]).any()):
        return None
    return torch.stack(bad).any(0)


def _add(out: Grads, more: Grads) -> Grads:
    for p, t in more.items():
        out[p] = out[p] + t if p in out else t
    return out


class GhostLedger:
    """Every ghost record since the last :meth:`clear`, by forward pass; ``handlers``: each layer's ``GhostHandler``."""

    def __init__(self, handlers: dict[nn.Module, GhostHandler], K: int) -> None:
        self.handlers, self.K = handlers, K
        self.pending: dict[int, dict[nn.Module, list[GhostCall]]] = {}
        self.settled: dict[int, dict[nn.Module, MaterialisedGroup]] = {}
        self._groups: Groups | None = None
        self._buffers: dict[tuple[Any, ...], Tensor] = {}

    def record(self, forward_id: int, module: nn.Module, call: GhostCall) -> None:
        self.pending.setdefault(forward_id, {}).setdefault(module, []).append(call)

    @exact_float32()  # per-sample work in IEEE float32, under autocast or TF32/bf16 products (engine.precision)
    def received(self, call: GhostCall) -> None:
        """``call`` received (more) backprops: settle it if its handler says so; the groups are rebuilt."""
        self._groups = None
        m, fid = call.call.module, call.call.forward_id
        handler = self.handlers[m]
        if fid not in self.pending or not handler.settles_call(m, call, self.K):  # kept, or forgotten by clear()
            return
        ordinal = list(self.pending).index(fid)
        settled = self.settled.setdefault(fid, {})
        n = sum(c.released for c in self.pending[fid][m])  # calls of m settled before this one
        scratch = partial(self._scratch, m, ("settled", ordinal, n))
        group = handler.settled_group(m, call, self.K, scratch)
        if m in settled:
            settled[m].absorb(group)
        else:
            settled[m] = group
        call.release()

    def clear(self) -> None:
        """Forget every record (the scratch buffers are kept for the next batch)."""
        self.pending, self.settled, self._groups = {}, {}, None

    def groups(self) -> Groups:
        """``{forward_id: (samples, {layer: group})}`` of the forward passes a backward pass reached, in order."""
        if self._groups is None:
            groups: Groups = {}
            for fid, layers in self.pending.items():
                every = [c for cs in layers.values() for c in cs]
                settled = self.settled.get(fid, {})
                if not settled and all(c.backprops is None for c in every):
                    continue  # no backward reached this forward pass (a metric with gradients on): it adds nothing
                rows = every[0].call.rows
                made: dict[nn.Module, GhostGroup] = {}
                for m, calls in layers.items():  # in the order the layers ran
                    done = [c for c in calls if c.backprops is not None]  # settled calls have let go of theirs
                    if m in settled and done and not self.handlers[m].materialises:
                        # other calls of m were settled: norms do not add up, so these join them
                        joined = made[m] = MaterialisedGroup({p: g.clone() for p, g in settled[m].grads.items()})
                        joined.absorb(materialise(m, done, self.K))
                        joined.how = settled[m].how
                    elif m in settled:
                        made[m] = settled[m]
                    elif done:
                        made[m] = self.handlers[m].make_group(m, done, self.K, partial(self._scratch, m, len(groups)))
                groups[fid] = (rows // self.K, made)
            self._groups = groups
        return self._groups

    def _scratch(
        self, m: nn.Module, ordinal: int | tuple[Any, ...], key: tuple[Any, ...], shape: tuple[int, ...], like: Tensor
    ) -> Tensor:
        """A buffer kept from step to step for layer ``m`` (in the ``ordinal``-th forward pass or settled call).

        Inside :func:`~dpnotebook.grad_sample._engine.capturable.capturable_step` a fresh one: a kept buffer
        would sit outside a CUDA graph's memory, and a step run outside the graph could replace it."""
        if not buffers_kept():
            return like.new_empty(shape)
        full = (id(m), ordinal, key)
        buf = self._buffers.get(full)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buffers[full] = like.new_empty(shape)
        return buf

    def layout(self, blocks: Blocks, name: Callable[[nn.Parameter], str] = repr) -> list[tuple[int, int]]:
        """``(forward_id, samples)`` of every forward pass the records or ``blocks`` saw, in forward order.

        Raises:
            GradSampleError: a block of ``p.grad_sample`` and the records of its forward pass disagree on B.
        """
        passes = {fid: B for fid, (B, _) in self.groups().items()}
        for p, held in blocks.items():
            for fid, n in held:
                if passes.setdefault(fid, n) != n:
                    raise GradSampleError(
                        f"forward pass {fid}: the ghosted layers saw {passes[fid]} samples but the hooks engine gave "
                        f"{name(p)} {n} per-sample gradients. Every layer of one forward pass must see the same samples."
                    )
        return sorted(passes.items())

    def align(self, sampled: MaterialisedGroup, blocks: Blocks, layout: list[tuple[int, int]]) -> MaterialisedGroup:
        """``sampled`` with each parameter's rows in ``layout``'s order, zeros for passes it did not see."""
        grads: Grads = {}
        for p, g in sampled.grads.items():
            held = blocks.get(p, [])
            if sum(n for _, n in held) != g.shape[0]:
                raise GradSampleError(f"{g.shape[0]} rows of grad_sample but blocks {held} describe other rows.")
            if held == layout:
                grads[p] = g
                continue
            starts, start = {}, 0
            for fid, n in held:
                starts[fid], start = start, start + n
            grads[p] = torch.cat(
                [g[starts[f] : starts[f] + n] if f in starts else g.new_zeros((n, *g.shape[1:])) for f, n in layout]
            )
        return MaterialisedGroup(grads, sampled.scale)

    def _passes(self, layout: list[tuple[int, int]]) -> list[tuple[int, dict[nn.Module, GhostGroup]]]:
        """``(samples, groups)`` of each forward pass of ``layout`` (no groups: it reached no ghosted layer)."""
        groups = self.groups()
        return [(n, groups[fid][1] if fid in groups else {}) for fid, n in layout]

    @staticmethod
    def num_samples(layout: list[tuple[int, int]]) -> int:
        """The number of samples B in all the forward passes of ``layout``."""
        return sum(n for _, n in layout)

    @exact_float32()
    def sq_norms(self, sampled: MaterialisedGroup, layout: list[tuple[int, int]]) -> Grads:
        """Every sample's squared gradient norm for each parameter: ``{p: [B]}`` (``sampled`` aligned to ``layout``)."""
        B = self.num_samples(layout)
        out: Grads = {}
        offset = 0
        for Bf, made in self._passes(layout):
            for group in made.values():
                for p, sq in group.sq_norms().items():
                    if Bf == B and p not in out:  # one forward pass holds every sample: nothing to place
                        out[p] = sq
                    else:
                        out.setdefault(p, sq.new_zeros(B))[offset : offset + Bf] += sq
            offset += Bf
        return _add(out, sampled.sq_norms())

    @exact_float32()
    def weighted_sums(
        self,
        weights: Tensor | Grads,
        sampled: MaterialisedGroup,
        layout: list[tuple[int, int]],
        dropped: Tensor | None | Literal["find"] = "find",
    ) -> Grads:
        """``sum_b w_b * (sample b's gradient)`` per parameter, ``weights`` ``[B]`` or ``{p: [B]}``, ``sampled`` too.

        ``dropped``: the samples whose weights are 0 or not finite (``None``: none), where the caller knows
        them; ``"find"`` finds them here, at one read on the host.
        """
        per_param = isinstance(weights, dict)
        dropped = _dropped(weights) if isinstance(dropped, str) else dropped
        if dropped is not None:  # a NaN weight times a zeroed row is still NaN
            if isinstance(weights, dict):
                clean = {id(w): torch.where(dropped, w.new_zeros(()), w) for w in weights.values()}
                weights = {p: clean[id(w)] for p, w in weights.items()}
            else:
                weights = torch.where(dropped, weights.new_zeros(()), weights)
        out: Grads = {}
        offset = 0
        for Bf, made in self._passes(layout):
            # one slice per weight vector: parameters that share clip factors share the object (one scaling)
            rows = {
                id(v): v[offset : offset + Bf] for v in (weights.values() if isinstance(weights, dict) else [weights])
            }
            for m, group in made.items():
                w = {
                    p: rows[id(weights[p] if isinstance(weights, dict) else weights)]
                    for p in m._parameters.values()
                    if p is not None and p.requires_grad and (not per_param or p in weights)
                }
                if dropped is not None and w:
                    group.drop(~dropped[offset : offset + Bf])
                _add(out, group.weighted_sums(w))
            offset += Bf
        w = weights if isinstance(weights, dict) else {p: weights for p in sampled.grads}
        if dropped is not None:
            sampled.drop(~dropped)
        return _add(out, sampled.weighted_sums(w))

    def strategies(self, paths: dict[nn.Module, str]) -> dict[str, str]:
        """``{path: how}``: how each recorded layer's norms are computed."""
        return {paths[m]: group.how for _, made in self.groups().values() for m, group in made.items()}
