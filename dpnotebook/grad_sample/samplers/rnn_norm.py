"""Recurrent layers in ghost mode: the ``GateProjection`` of ``DPLSTM``, ``DPGRU`` and ``DPRNN``.

One layer and direction has an input-side weight (on ``x_t``) and a hidden-side weight (on
``h_{t-1}``, from the layer's record), both fed the gate backprops ``g_t`` (GRU's candidate
gate: ``r_t * g_t`` on the hidden side): two Linear pieces over a sample's ``K*T`` positions.
Sharing ``G``, their Gram norms need ``G Gᵀ`` once (:func:`shared_gram_sq_norms`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpnotebook.grad_sample.samplers._contracts import GhostCall, GhostGroup, Grads, Scratch, register_norm_sampler
from dpnotebook.grad_sample.samplers.linear_norm import LinearPiece, _chunk, guard_gram, linear_piece, linear_strategy
from dpnotebook.units import GateProjection

__all__ = ["shared_gram_sq_norms", "shared_gram_pays"]


def shared_gram_sq_norms(As: list[Tensor], G: Tensor) -> list[Tensor]:
    """``‖G_bᵀ A_b‖²`` for several ``A`` (``[B, n, in_i]``) that share the backprops ``G``: one ``G Gᵀ``.

    >>> A1, A2, G = torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(2, 3, 6)
    >>> n1, n2 = shared_gram_sq_norms([A1, A2], G)
    >>> torch.allclose(n2, torch.einsum("bno,bni->boi", G, A2).flatten(1).pow(2).sum(1), rtol=1e-4)
    True
    """
    B, n = G.shape[:2]
    out = [G.new_empty(B) for _ in As]
    step = _chunk(B, (1 + len(As)) * n * n, G)
    for s in range(0, B, step):
        g = G[s : s + step]
        gg = g @ g.mT
        for o, A in zip(out, As, strict=True):
            a = A[s : s + step]
            o[s : s + step] = (a @ a.mT * gg).sum((1, 2))
    return [guard_gram(A, G, o) for A, o in zip(As, out, strict=True)]


def shared_gram_pays(ins: list[int], n: int, d_out: int) -> bool:
    """Whether :func:`shared_gram_sq_norms` costs less than each piece on its own (by multiply-adds).

    >>> shared_gram_pays([64, 128], 64, 512), shared_gram_pays([64, 128], 1024, 512)
    (True, False)
    """
    alone = sum(min(n * n * (i + d_out), n * i * d_out) for i in ins)
    return n > 1 and n * n * (sum(ins) + d_out) < alone


class GateGroup(GhostGroup):
    """One RNN layer and direction: input-side and hidden-side Linear pieces, and both biases."""

    def __init__(self, unit: GateProjection, x_side: LinearPiece, h_side: LinearPiece, shared: bool) -> None:
        self.unit, self.x_side, self.h_side = unit, x_side, h_side
        A, H, G = x_side.A, h_side.A, x_side.G
        self.shared = shared and shared_gram_pays([A.shape[2], H.shape[2]], A.shape[1], G.shape[2])
        if shared:  # LSTM, RNN: the hidden side gets the very same backprops
            h_side._bias = x_side.bias_grads()
        self.how = "ghost shared-gram" if self.shared else f"ghost {x_side.strategy}+{h_side.strategy}"
        self._weight_sq: dict[nn.Parameter, Tensor] | None = None

    def _weight_sq_norms(self) -> dict[nn.Parameter, Tensor]:
        if self._weight_sq is None:
            u, x, h = self.unit, self.x_side, self.h_side
            if self.shared:
                nx, nh = shared_gram_sq_norms([x.A, h.A], x.G)
                self._weight_sq = {u.weight_ih: nx * x.scale**2, u.weight_hh: nh * h.scale**2}
            else:
                self._weight_sq = {u.weight_ih: x.weight_sq_norms(), u.weight_hh: h.weight_sq_norms()}
        return self._weight_sq

    def _parts(self) -> list[tuple[nn.Parameter | None, LinearPiece, bool]]:
        u = self.unit
        return [
            (u.weight_ih, self.x_side, True),
            (u.weight_hh, self.h_side, True),
            (u.bias_ih, self.x_side, False),
            (u.bias_hh, self.h_side, False),
        ]

    def sq_norms(self) -> Grads:
        return {
            p: self._weight_sq_norms()[p] if is_weight else piece.bias_grads().pow(2).sum(1)
            for p, piece, is_weight in self._parts()
            if p is not None and p.requires_grad
        }

    def weighted_sums(self, weights: Grads) -> Grads:
        return {
            p: piece.weight_sum(weights[p]) if is_weight else weights[p].to(p.dtype) @ piece.bias_grads()
            for p, piece, is_weight in self._parts()
            if p is not None and p in weights
        }

    def drop(self, keep: Tensor) -> None:
        shared = self.h_side.G is self.x_side.G
        self.x_side.drop(keep)
        self.h_side.drop(keep)
        if shared:
            self.h_side.G, self.h_side._bias = self.x_side.G, self.x_side.bias_grads()
        self._weight_sq = None


def gate_settles(unit: GateProjection, call: GhostCall, K: int) -> bool:
    """Whether both sides' per-sample gradients (``n = K * T`` positions) are the cheaper path: settle the call.

    >>> from dpnotebook.layers import DPLSTM
    >>> from dpnotebook.grad_sample._engine.calls import LayerCall
    >>> unit = DPLSTM(64, 128).gate_projections[0]
    >>> x, g = torch.zeros(16, 16, 64), torch.zeros(16, 16, 512)   # T = 16 steps
    >>> call = GhostCall(LayerCall(unit, "u", (x, None), {}, [0], 0, 16, 0), g)
    >>> gate_settles(unit, call, K=1), gate_settles(unit, call, K=16)
    (False, True)
    """
    x, g = call.activations()[0], call.backprops
    if g is None:
        return False
    n, ins = K * x.shape[1], [x.shape[-1], unit.weight_hh.shape[1]]
    direct = all(linear_strategy(n, d, g.shape[-1]) == "direct" for d in ins)
    return direct and not shared_gram_pays(ins, n, g.shape[-1])


# the recurrence uses weight_hh and bias_hh too
@register_norm_sampler(GateProjection, outside=("weight_hh", "bias_hh"), settles=gate_settles)
def gate_group(unit: GateProjection, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> GhostGroup:
    """``dpnotebook.layers.GateProjection``: the hidden states come from the layer's record.

    >>> import dpnotebook
    >>> from dpnotebook.layers import DPLSTM
    >>> lstm = dpnotebook.wrap_model(DPLSTM(3, 4, batch_first=True), "ghost")
    >>> lstm(torch.randn(2, 5, 3))[0].sum().backward()
    >>> lstm.per_sample_norms().shape
    torch.Size([2])
    """
    xs: list[tuple[Tensor, Tensor, float]] = []
    hs: list[tuple[Tensor, Tensor, float]] = []
    shared = True
    for c in calls:
        acts = c.activations()
        x, record, g = acts[0], acts[1], c.received()
        with torch.no_grad():
            h_prev = record.hidden_inputs().to(g.dtype)
            g_hh = unit.hidden_backprops(x, h_prev, g)
        shared = shared and g_hh is g
        xs.append((x, g, c.scale))
        hs.append((h_prev, g_hh, c.scale))
    x_side = linear_piece(xs, K)
    h_side = linear_piece(hs, K)
    if shared:
        h_side.G = x_side.G  # one tensor (the concatenation made two copies)
    return GateGroup(unit, x_side, h_side, shared)
