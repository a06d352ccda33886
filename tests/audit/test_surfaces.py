"""The training-loop surfaces of the auditor (issue #28.1-3), in every mode: refused as documented, or bounded.

On main 3c3f8c6 each surface broke the bound in some mode (measured with the neighbour that sets one sample's loss
weight to 0): freezing after backward 105.5 C (hooks, functorch, ew), make_private twice sqrt(2) C (hooks,
functorch, ew; ghost's second optimizer got a zero update), a clipping scheduler inside BatchMemoryManager 8 C
(every mode).
"""

from __future__ import annotations

import pytest

from dpnotebook.audit import SURFACES, audit_surface, surface_matches
from dpnotebook.modes import available_modes

POINTS = [(name, mode) for name in SURFACES for mode in available_modes()]


@pytest.mark.parametrize("name,mode", POINTS, ids=[f"{n}-{m}" for n, m in POINTS])
def test_each_surface_is_refused_or_keeps_the_bound(name: str, mode: str) -> None:
    why = surface_matches(name, mode)
    assert why is None, f"{name} in {mode}: {why}"


def test_the_auditor_sees_a_broken_step() -> None:
    """The measurement itself: ghost applies no raw gradient, and the neighbour moves the step by exactly C."""
    report = audit_surface("freeze_after_backward", "ghost")
    assert report.max_ratio == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(KeyError, match=r"surface 'bogus' is unknown; choose one of \['clip_scheduler"):
        audit_surface("bogus", "hooks")
