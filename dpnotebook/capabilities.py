"""What each grad-sample mode can do, found by running it (never written by hand).

Every feature is a tiny model and input, run in each mode against the float64 oracle: ``yes`` when
they agree (the norms, for a norms-only mode such as ``ghost``), ``no`` with the mode's own error
when it refuses, ``WRONG`` if a mode ever returned wrong numbers (the tests assert it never does).

>>> from dpnotebook.capabilities import capability_table
>>> row = capability_table(features=["padding='same'"])[0]
>>> row.feature, row.cells["hooks"].status
("padding='same'", 'yes')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.compare import error_against, mode_result
from dpnotebook.layers import DPLSTM, DPMultiheadAttention, DPRNNBase
from dpnotebook.modes import available_modes, wrap_model
from dpnotebook.testing import random_target, reference_grad_samples

__all__ = ["Cell", "CapabilityRow", "capability_table", "capability_markdown", "FEATURES"]

TOLERANCE = 1e-5  # float32 models against the float64 oracle


class _Scale(nn.Module):
    """A layer with a grad sampler registered below (the "custom sampler" feature)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.w


def _register_scale_sampler() -> None:
    from dpnotebook.grad_sample import find_grad_sampler, register_grad_sampler

    if find_grad_sampler(_Scale(1)) is None:

        @register_grad_sampler(_Scale)
        def scale_grad_sampler(
            layer: _Scale, activations: list[Any], backprops: Tensor, K: int
        ) -> dict[nn.Parameter, Tensor]:
            per_row = activations[0] * backprops
            return {layer.w: per_row.reshape(-1, K, per_row.shape[-1]).sum(1) / K}


class _LastStep(nn.Module):
    """Recurrent layer (native or DP) followed by a linear head on the last time step."""

    def __init__(self, rnn: nn.RNNBase | DPRNNBase) -> None:
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(rnn.hidden_size, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class _SelfAttention(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


Build = Callable[[Callable[..., Tensor]], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]

#: Each feature's model, inputs (drawn with the ``randn`` given) and wrapper keywords.
_BUILDERS: dict[str, Build] = {
    "batch_first=False": lambda randn: (_mlp(), (randn(3, 4, 3),), {"batch_first": False}),
    "recurrent (DPLSTM)": lambda randn: (_LastStep(DPLSTM(3, 4, batch_first=True)), (randn(4, 5, 3),), {}),
    "padding='same'": lambda randn: (nn.Conv2d(2, 3, 3, padding="same"), (randn(4, 2, 5, 5),), {}),
    "empty batch": lambda randn: (_mlp(), (randn(0, 3),), {}),
    "K > 1": lambda randn: (
        nn.Sequential(nn.Conv1d(2, 3, 2), nn.Flatten(), nn.Linear(9, 2)),
        (randn(6, 2, 4),),
        {"K": 3},
    ),
    "custom grad sampler": lambda randn: (nn.Sequential(nn.Linear(3, 3), _Scale(3)), (randn(4, 3),), {"K": 2}),
    "native nn.LSTM": lambda randn: (_LastStep(nn.LSTM(3, 4, batch_first=True)), (randn(4, 5, 3),), {}),
    "native nn.MultiheadAttention": lambda randn: (
        _SelfAttention(nn.MultiheadAttention(4, 2, batch_first=True)),
        (randn(4, 3, 4),),
        {},
    ),
    "DPMultiheadAttention": lambda randn: (
        _SelfAttention(DPMultiheadAttention(4, 2, batch_first=True)),
        (randn(4, 3, 4),),
        {},
    ),
}
FEATURES = list(_BUILDERS)


@dataclass(frozen=True)
class Cell:
    """One mode on one feature: ``status`` is ``"yes"``, ``"no"`` or ``"WRONG"``; ``note`` says why."""

    status: str
    note: str = ""


@dataclass(frozen=True)
class CapabilityRow:
    feature: str
    cells: dict[str, Cell]


def _run(mode: str, build: Build, randn: Callable[..., Tensor]) -> Cell:
    torch.manual_seed(0)
    model, inputs, kwargs = build(randn)
    K, batch_first = kwargs.get("K", 1), kwargs.get("batch_first", True)
    ref = reference_grad_samples(model, inputs, K=K, batch_first=batch_first)
    target = random_target(model.double(), tuple(x.double() for x in inputs)).float()
    model.float()
    try:
        wrapped = wrap_model(model, mode, loss_reduction="sum", **kwargs)
        (wrapped(*inputs) * target).sum().backward()
        got = mode_result(wrapped, model)
    except Exception as err:  # noqa: BLE001 - the refusal itself is what the table reports
        problems = getattr(err, "problems", None)
        reason = f"{problems[0].module_type}: {problems[0].fix}" if problems else str(err).splitlines()[0]
        return Cell("no", f"{type(err).__name__}: {reason}")
    if error_against(got, ref) > TOLERANCE:
        return Cell("WRONG", "differs from the oracle")
    return Cell("yes", "per-sample norms only" if isinstance(got, Tensor) else "")


def capability_table(*, modes: list[str] | None = None, features: list[str] | None = None) -> list[CapabilityRow]:
    """Run each of ``features`` (default: :data:`FEATURES`) in each of ``modes`` (default: all registered)."""
    _register_scale_sampler()
    unknown = [f for f in features or [] if f not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}; choose from {FEATURES}.")
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g)

    modes = modes or available_modes()
    return [CapabilityRow(f, {m: _run(m, _BUILDERS[f], randn) for m in modes}) for f in (features or FEATURES)]


def capability_markdown(rows: list[CapabilityRow] | None = None) -> str:
    """The table as Markdown, with each refusal's reason as a footnote-style second line."""
    rows = rows if rows is not None else capability_table()
    modes = list(rows[0].cells)
    lines = ["| feature | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for row in rows:
        cells = (f"{c.status} ({c.note})" if c.note else c.status for c in (row.cells[m] for m in modes))
        lines.append(f"| {row.feature} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(capability_markdown())
