"""Every fast form attached at registration gives its formula's numbers, through the wrapper.

Parametrised over the registry: a layer type registered with ``fast=`` and no
example below fails, so no fast form goes unchecked. Each case runs the wrapper
twice, with the entry as registered (the fast form must run) and with the fast
form taken off (the formula runs), in float64, and compares every grad_sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from dpnotebook.grad_sample import GradSampleModule
from dpnotebook.grad_sample import _registry as registry

#: layer type -> [(layer, input of B*K rows (B, K, batch_first) -> tensor, batch_first values it takes)]
Example = tuple[Callable[[], nn.Module], Callable[[int, bool], torch.Tensor], tuple[bool, ...]]
EXAMPLES: dict[type[nn.Module], list[Example]] = {
    nn.Conv1d: [
        (lambda: nn.Conv1d(2, 4, 3, padding=1, stride=2), lambda n, bf: torch.randn(n, 2, 9), (True,)),
        (lambda: nn.Conv1d(4, 4, 2, groups=2, padding="same"), lambda n, bf: torch.randn(n, 4, 6), (True,)),
    ],
    nn.Conv2d: [
        (lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), lambda n, bf: torch.randn(n, 2, 6, 6), (True,)),
        (lambda: nn.Conv2d(4, 6, 3, groups=2, dilation=2), lambda n, bf: torch.randn(n, 4, 7, 7), (True,)),
        (lambda: nn.Conv2d(3, 8, 3, padding=1), lambda n, bf: torch.randn(n, 3, 16, 16), (True,)),  # CPU: grouped
    ],
    nn.Conv3d: [(lambda: nn.Conv3d(2, 2, 2, stride=(1, 2, 1)), lambda n, bf: torch.randn(n, 2, 3, 4, 4), (True,))],
    nn.Linear: [
        (lambda: nn.Linear(4, 3), lambda n, bf: torch.randn(n, 4), (True,)),
        (lambda: nn.Linear(4, 3), lambda n, bf: torch.randn((n, 5, 4) if bf else (5, n, 4)), (True, False)),
    ],
    nn.Embedding: [
        (
            lambda: nn.Embedding(7, 3, padding_idx=2),
            lambda n, bf: torch.randint(0, 7, (n, 5) if bf else (5, n)),
            (True, False),
        )
    ],
}
FAST = [t for t, entry in registry._SAMPLERS.items() if entry.fast is not None]


def grad_samples(
    layer: nn.Module, x: torch.Tensor, K: int, batch_first: bool, reduction: str
) -> dict[str, torch.Tensor]:
    wrapped = GradSampleModule(layer, K=K, batch_first=batch_first, loss_reduction=reduction)
    wrapped(x).pow(2).sum().backward()
    got = {n: p.grad_sample for n, p in layer.named_parameters() if p.requires_grad}
    wrapped.to_standard_module()
    for p in layer.parameters():
        p.grad_sample, p.grad = None, None
    return got


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("layer_type", FAST, ids=lambda t: t.__name__)
def test_every_fast_form_equals_its_formula(
    layer_type: type[nn.Module], K: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert layer_type in EXAMPLES, f"{layer_type.__name__} has a fast form: add an example to EXAMPLES"
    entry, ran = registry._SAMPLERS[layer_type], []

    def counted(*args: object) -> dict[nn.Parameter, torch.Tensor]:
        ran.append(1)
        assert entry.fast is not None
        return entry.fast(*args)

    for make, make_input, batch_firsts in EXAMPLES[layer_type]:
        for B, batch_first, reduction, frozen in [
            (B, bf, r, f)
            for B in (0, 1, 3)
            for bf in batch_firsts
            for r in ("mean", "sum")
            for f in ("", "weight", "bias")
        ]:
            torch.manual_seed(B)
            layer = make().double()
            if frozen and (getattr(layer, frozen, None) is None or len(list(layer.parameters())) == 1):
                continue  # nothing to freeze, or nothing left to train
            if frozen:
                getattr(layer, frozen).requires_grad_(False)
            x = make_input(B * K, batch_first)
            x = x.double() if x.is_floating_point() else x
            monkeypatch.setitem(registry._SAMPLERS, layer_type, dataclasses.replace(entry, fast=counted))
            before = len(ran)
            fast = grad_samples(layer, x, K, batch_first, reduction)
            assert len(ran) > before, "the fast form did not run"
            monkeypatch.setitem(registry._SAMPLERS, layer_type, dataclasses.replace(entry, fast=None))
            formula = grad_samples(layer, x, K, batch_first, reduction)
            case = f"{layer} B={B} K={K} batch_first={batch_first} {reduction} frozen={frozen or None}"
            assert fast.keys() == formula.keys() and fast, case
            for name, want in formula.items():
                assert want.shape[0] == B and B == 0 or want.abs().max() > 1e-3, case  # a comparison that can fail
                assert torch.allclose(fast[name], want, rtol=1e-10, atol=1e-10), f"{case}: {name}"
