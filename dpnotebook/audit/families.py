"""Small seeded models, one per *layer family*, for the sensitivity auditor.

Each family covers one way a per-sample gradient is formed or one way a model
is put together that has broken DP libraries before: a registered sampler
(``mlp``, ``conv``, ``seq_linear``, ``embedding``, ``norms``), the ``torch.func``
fallback (``fallback``), DP recurrent and attention layers (``lstm``,
``attention``), tied and shared modules (``tied``, ``shared_parent``), a
parameter used outside its layer (``outside_use``), a model that runs
time-major inside while its input is batch-first (``time_major``) and a T5-style
relative-position bias whose ``T`` query positions equal the batch's rows
(``relative_bias``, audited with neighbours that keep the batch size).

A sequence family's sample is ``[T, ...]`` and its output ``[T, classes]``; in
the time-major layout (``batch_first=False``) rows are in dim 1 of both.

>>> sorted(FAMILIES)[:4]
['attention', 'conv', 'embedding', 'fallback']
>>> x, t = FAMILIES["embedding"].data(3, 2, torch.Generator().manual_seed(0))
>>> tuple(x.shape), x.dtype, tuple(t.shape)
((3, 2, 5), torch.int64, (3, 2, 5, 3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpnotebook.layers import DPLSTM, DPMultiheadAttention

__all__ = ["Family", "FAMILIES", "RelativeBias"]

T = 5  # positions of a sequence sample


@dataclass(frozen=True)
class Family:
    """A model maker and the shapes of one sample.

    Attributes:
        name: the family's key in :data:`FAMILIES`.
        make: ``make(batch_first) -> model``.
        sample: the shape of one row's input (token ids when ``vocab`` is set).
        out: the shape of one row's output.
        sequence: rows may be in dim 1 (``batch_first=False``) as well.
        vocab: ids are drawn from ``range(vocab)`` (``0`` for float inputs).
        out_batch_first: the output keeps rows in dim 0 in either layout.
        same_size_neighbours: the neighbour of a batch keeps every sample and sets the
            removed one's loss weight to 0 (its targets), so that the batch size, which
            a coincidence of counts may depend on, does not change.
    """

    name: str
    make: Callable[[bool], nn.Module]
    sample: tuple[int, ...]
    out: tuple[int, ...]
    sequence: bool = False
    vocab: int = 0
    out_batch_first: bool = False
    same_size_neighbours: bool = False

    @property
    def layouts(self) -> tuple[bool, ...]:
        """The ``batch_first`` values the family is audited in."""
        return (True, False) if self.sequence else (True,)

    def data(self, n: int, K: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """Friendly data: ``[n, K, *sample]`` inputs and ``[n, K, *out]`` targets (copies differ slightly)."""
        if self.vocab:
            x = torch.randint(1, self.vocab, (n, 1, *self.sample), generator=gen).expand(n, K, *self.sample).clone()
        else:
            base = torch.randn(n, 1, *self.sample, generator=gen)
            x = base + 0.1 * torch.randn(n, K, *self.sample, generator=gen)  # K augmented copies
        return x, torch.randn(n, K, *self.out, generator=gen)


class _LSTMHead(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.lstm = DPLSTM(6, 5, batch_first=batch_first)
        self.out = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.lstm(x)[0])


class _SelfAttention(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attn = DPMultiheadAttention(8, 2, batch_first=batch_first)
        self.out = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.attn(x, x, x, need_weights=False)[0])


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 11)
        self.out.weight = self.emb.weight  # tied: one Parameter, two layers

    def forward(self, idx: Tensor) -> Tensor:
        return self.out(torch.tanh(self.emb(idx)))


class _SharedParent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(6, 6)
        self.a = nn.Sequential(shared, nn.Tanh())  # one module, two parents
        self.b = nn.Sequential(shared, nn.Tanh())
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.b(self.a(x)))


class _OutsideUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.fc(x))
        return self.head(F.linear(h, self.fc.weight))  # fc.weight used again, outside fc


class _TimeMajorInside(nn.Module):
    """Takes ``[B, T]`` ids and runs time-major inside (``emb(idx.t())``), a common RNN idiom.

    Every layer sees ``T`` rows in dim 0, so a wrapper that trusts dim 0 clips
    time steps, not samples.
    """

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, idx: Tensor) -> Tensor:
        h = torch.tanh(self.emb(idx.t()))  # [T, B, 6]
        return self.out(h).transpose(0, 1)  # back to [B, T, 3]


class _LastStep(nn.Module):
    """A sequence in either layout in, one output per sample (``[B, classes]``, batch-first) out."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.proj = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.proj(x))
        return self.head(h[:, -1] if self.batch_first else h[-1])


class RelativeBias(nn.Module):
    """T5-style self-attention: a relative-position bias table looked up with a ``[T, T]`` bucket matrix.

    The bias (``nn.Embedding(buckets, heads)`` of the ``[T, T]`` relative distances,
    ``[H, T, T]``) is computed once and broadcast over the batch, as in Hugging Face
    T5. Its rows are the ``T`` query positions; when ``T`` equals the batch's ``B*K``
    rows no count can tell them from samples (:mod:`~dpnotebook.grad_sample._engine.provenance`
    proves them instead).

    >>> RelativeBias()(torch.randint(0, 11, (3, 4))).shape
    torch.Size([3, 4, 3])
    """

    def __init__(self, vocab: int = 11, d: int = 8, heads: int = 2, buckets: int = 7, classes: int = 3) -> None:
        super().__init__()
        self.heads, self.buckets = heads, buckets
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.rel = nn.Embedding(buckets, heads)
        self.out = nn.Linear(d, classes)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        q, k, v = self.qkv(self.emb(idx)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        pos = torch.arange(T, device=idx.device)
        half = self.buckets // 2
        buckets = (pos[None, :] - pos[:, None]).clamp(-half, half) + half  # [T, T] relative distances
        bias = self.rel(buckets).permute(2, 0, 1)  # [H, T, T], shared by the batch
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


def _conv(batch_first: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("mlp", lambda bf: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), (6,), (3,)),
        Family("conv", _conv, (1, 6, 6), (3,)),
        Family("norms", lambda bf: nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 3)), (6,), (3,)),
        Family("fallback", lambda bf: nn.Sequential(nn.Linear(6, 8), nn.PReLU(8), nn.Linear(8, 3)), (6,), (3,)),
        Family("seq_linear", lambda bf: nn.Linear(64, 64, bias=False), (T, 64), (T, 64), sequence=True),
        Family(
            "embedding",
            lambda bf: nn.Sequential(nn.Embedding(11, 6, padding_idx=0), nn.Linear(6, 3)),
            (T,),
            (T, 3),
            sequence=True,
            vocab=11,
        ),
        Family("lstm", _LSTMHead, (T, 6), (T, 3), sequence=True),
        Family("attention", _SelfAttention, (T, 8), (T, 3), sequence=True),
        Family("tied", lambda bf: _Tied(), (T,), (T, 11), sequence=True, vocab=11),
        Family("shared_parent", lambda bf: _SharedParent(), (6,), (3,)),
        Family("outside_use", lambda bf: _OutsideUse(), (6,), (3,)),
        Family("time_major", lambda bf: _TimeMajorInside(), (T,), (T, 3), vocab=11),
        Family("last_step", _LastStep, (T, 6), (3,), sequence=True, out_batch_first=True),
        # T = 4 = the audit's samples: at K = 1 the batch's rows equal the query positions
        Family("relative_bias", lambda bf: RelativeBias(), (4,), (4, 3), vocab=11, same_size_neighbours=True),
    ]
}
