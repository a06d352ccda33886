"""``DPMultiheadAttention``: a drop-in replacement for ``nn.MultiheadAttention``.

Same constructor, parameter names, ``state_dict``, forward arguments and outputs, computed as
``F.multi_head_attention_forward`` does, but batch-first inside and through the units of
:mod:`dpnotebook.units`, so hooks mode finds a sampler for every parameter (attention dropout runs
outside every unit). It also works as ``nn.TransformerEncoderLayer.self_attn``.

>>> import torch
>>> from torch import nn
>>> native = nn.MultiheadAttention(8, 2, batch_first=True)
>>> dp = DPMultiheadAttention(8, 2, batch_first=True)
>>> _ = dp.load_state_dict(native.state_dict())
>>> x = torch.randn(3, 5, 8)
>>> torch.allclose(dp(x, x, x)[0], native(x, x, x)[0], atol=1e-6)
True
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.units import AppendBias, InProjection, OutProjection, SharedParameters, UnitOwner


def float_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean mask (``True`` = may not attend) as an additive float mask; float masks pass through.

    >>> import torch
    >>> float_mask(torch.tensor([True, False]), torch.float32)
    tensor([-inf, 0.])
    """
    if mask is None or mask.is_floating_point():
        return mask
    if mask.dtype != torch.bool:
        raise AssertionError("only bool and floating types of masks are supported")
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


class DPMultiheadAttention(UnitOwner):
    """Multi-head attention with hooks-mode per-sample gradients; the arguments of ``nn.MultiheadAttention``.

    Args:
        embed_dim: total width of the model (split over the ``num_heads`` heads, which must divide it).
        num_heads: number of attention heads.
        dropout: dropout on the attention weights (training only).
        bias: add biases to the input and output projections.
        add_bias_kv: append a learned bias to the key and value sequences.
        add_zero_attn: append a zero to the key and value sequences.
        kdim, vdim: width of the keys and values (default ``embed_dim``).
        batch_first: inputs are ``[B, T, E]`` rather than ``[T, B, E]``.
        device, dtype: of the parameters.
    """

    merge_masks = nn.MultiheadAttention.merge_masks  # used by TransformerEncoderLayer's fast path
    _reset_parameters = nn.MultiheadAttention._reset_parameters  # the same initialisation, in the same order
    in_proj_bias: nn.Parameter | None
    bias_k: nn.Parameter | None  # None unless add_bias_kv (then bias_v is set too)
    bias_v: nn.Parameter | None
    in_proj: InProjection  # the units: in_proj, or q_in_proj, k_in_proj, v_in_proj when kdim or vdim differ
    q_in_proj: InProjection
    k_in_proj: InProjection
    v_in_proj: InProjection
    append_bias_k: AppendBias  # with add_bias_kv
    append_bias_v: AppendBias

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        # torch's own checks and parameter layout, on the meta device (no memory)
        ref = nn.MultiheadAttention(
            embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first, device="meta"
        )
        self.embed_dim, self.kdim, self.vdim, self.head_dim = ref.embed_dim, ref.kdim, ref.vdim, ref.head_dim
        self.num_heads, self.dropout, self.batch_first = ref.num_heads, ref.dropout, ref.batch_first
        self._qkv_same_embed_dim, self.add_zero_attn = ref._qkv_same_embed_dim, add_zero_attn
        for name, p in ref._parameters.items():
            self.register_parameter(
                name, None if p is None else nn.Parameter(torch.empty(p.shape, device=device, dtype=dtype))
            )
        if not add_bias_kv:
            self.bias_k = self.bias_v = None
        self.out_proj = OutProjection(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        links: list[tuple[SharedParameters, dict[str, str]]] = []
        for weight in ["in_proj_weight"] if self._qkv_same_embed_dim else [f"{p}_proj_weight" for p in "qkv"]:
            unit = InProjection(getattr(self, weight), self.in_proj_bias)
            setattr(self, "in_proj" if weight == "in_proj_weight" else f"{weight[0]}_in_proj", unit)
            links.append((unit, {"weight": weight, "bias": "in_proj_bias"}))
        for name in ("bias_k", "bias_v") if add_bias_kv else ():
            setattr(self, f"append_{name}", AppendBias(getattr(self, name)))
            links.append((getattr(self, f"append_{name}"), {"bias": name}))
        self._unit_links = links
        self._reset_parameters()  # type: ignore[misc]  # torch's, reading only what this class has

    # -- the forward pass ------------------------------------------------------
    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v ``[N, L or S, E]``: one call for self-attention, as few as possible otherwise."""
        E = self.embed_dim
        rows = [(0, E), (E, 2 * E), (2 * E, 3 * E)]
        if not self._qkv_same_embed_dim:
            units = (self.q_in_proj, self.k_in_proj, self.v_in_proj)
            return tuple(u(x, (0, E), r) for u, x, r in zip(units, (query, key, value), rows, strict=True))
        if query is key and key is value:
            return self.in_proj(query, (0, 3 * E), (0, 3 * E)).chunk(3, -1)
        q = self.in_proj(query, rows[0], rows[0])
        if key is value:
            return (q, *self.in_proj(key, (E, 3 * E), (E, 3 * E)).chunk(2, -1))
        return q, self.in_proj(key, rows[1], rows[1]), self.in_proj(value, rows[2], rows[2])

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Same arguments and outputs as ``nn.MultiheadAttention.forward``."""
        batched = query.dim() == 3
        if not (batched and self.batch_first):  # work batch-first: [N, L, E]
            query, key, value = self._transpose_same(query, key, value, unbatched=not batched)
        if not batched and key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
        N, L, _ = query.shape
        H, hd = self.num_heads, self.head_dim
        if query.shape[-1] != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got {query.shape[-1]}")
        key_padding_mask = float_mask(key_padding_mask, query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                "method `generate_square_subsequent_mask` to create this mask."
            )
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # scaled_dot_product_attention applies the causal mask itself
        else:
            attn_mask = float_mask(attn_mask, query.dtype)
            is_causal = is_causal and key_padding_mask is None

        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:
            k, v = self.append_bias_k(k), self.append_bias_v(v)
        q, k, v = (t.reshape(N, t.shape[1], H, hd).transpose(1, 2) for t in (q, k, v))  # [N, H, *, hd]
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        if self.add_zero_attn:
            k, v = (torch.cat([t, t.new_zeros(N, H, 1, hd)], 2) for t in (k, v))
        mask = self._merged_mask(attn_mask, key_padding_mask, N, L, k.shape[2], extra)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q * math.sqrt(1.0 / hd)) @ k.transpose(-2, -1)
            weights = torch.softmax(scores if mask is None else scores + mask, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = weights @ v
            weights = weights.mean(1) if average_attn_weights else weights
        else:
            out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal)
            weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, self.embed_dim))
        if not batched:
            return out.squeeze(0), None if weights is None else weights.squeeze(0)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    @staticmethod
    def _transpose_same(query: Tensor, key: Tensor, value: Tensor, unbatched: bool = False) -> tuple[Tensor, ...]:
        """Move the batch to dim 0 (or add it), keeping ``query is key is value`` as it was."""
        move = (lambda t: t.unsqueeze(0)) if unbatched else (lambda t: t.transpose(0, 1))
        q = move(query)
        k = q if key is query else move(key)
        v = k if value is key else (q if value is query else move(value))
        return q, k, v

    def _merged_mask(
        self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, N: int, L: int, S: int, extra: int
    ) -> Tensor | None:
        """``attn_mask`` plus ``key_padding_mask`` as ``[N|1, H|1, L, S]``, with zero columns for the ``extra`` keys."""
        if attn_mask is not None:
            H, S0 = self.num_heads, S - extra
            expected = {2: (L, S0), 3: (N * H, L, S0)}.get(attn_mask.dim())
            if expected is None:
                raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")
            if tuple(attn_mask.shape) != expected:
                raise RuntimeError(
                    f"The shape of the {attn_mask.dim()}D attn_mask is {attn_mask.shape}, but should be {expected}."
                )
            attn_mask = F.pad(attn_mask.reshape(-1, H if attn_mask.dim() == 3 else 1, L, S0), (0, extra))
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S - extra):
                raise AssertionError(
                    f"expecting key_padding_mask shape of {(N, S - extra)}, but got {tuple(key_padding_mask.shape)}"
                )
            kpm = F.pad(key_padding_mask, (0, extra)).reshape(N, 1, 1, S)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm
        return attn_mask

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


__all__ = ["DPMultiheadAttention", "float_mask"]
