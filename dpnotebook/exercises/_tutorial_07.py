"""Checks of tutorial 07 (recurrent and attention models): make an ``nn.GRU`` ready for hooks mode."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dpnotebook.exercises._core import register_check, require


@register_check("07.fix_gru", todo="build the GRU, then fixed_gru = dpnotebook.fix(gru)")
def check_fix_gru(fixed: Any, original: nn.Module, inputs: Tensor) -> str:
    """A ``DPGRU`` with the original's parameters and outputs, and nothing left for ``validate``."""
    import dpnotebook

    require(isinstance(fixed, nn.Module), f"fixed_gru is a {type(fixed).__name__}: make it the model fix returned")
    require(
        fixed is not original,
        "fixed_gru is the original GRU object: dpnotebook.fix returns a new model; keep "
        "both, so the outputs can be compared",
    )
    require(
        type(fixed).__name__ == "DPGRU",
        f"fixed_gru is still a {type(fixed).__name__}: dpnotebook.fix(gru) returns a copy with DPGRU swapped in",
    )
    problems = dpnotebook.validate(fixed)
    require(problems == [], f"validate still finds {[p.path for p in problems]}")
    require(
        list(dict(original.named_parameters())) == list(dict(fixed.named_parameters())),
        "the parameter names differ from the GRU's: was it built with the same arguments?",
    )
    with torch.no_grad():
        want, got = original(inputs)[0], fixed(inputs)[0]
    require(
        got.shape == want.shape and torch.allclose(got, want, atol=1e-5),
        "the outputs differ from the GRU's: fix copies the weights; did you re-create or re-train either model?",
    )
    return "a DPGRU with the GRU's parameter names and outputs; validate finds nothing left"
