"""Ghost mode: per-sample gradient norms and the clipped sum, without per-sample gradients.

* :mod:`~dpnotebook.grad_sample.ghost.wrapper`:
  :class:`~dpnotebook.grad_sample.ghost.wrapper.GhostGradSampleModule`;
* :mod:`~dpnotebook.grad_sample.ghost.groups`: one layer's calls in a forward pass,
  and what a norm sampler returns;
* :mod:`~dpnotebook.grad_sample.ghost.registry`: the open registry of norm samplers
  (``register_norm_sampler``); the built-in ones sit beside their grad samplers in
  :mod:`dpnotebook.grad_sample.samplers`;
* :mod:`~dpnotebook.grad_sample.ghost.ledger`: a batch's records and what they add
  up to; :mod:`~dpnotebook.grad_sample.ghost.tap`: how a layer's output gradient is
  heard; :mod:`~dpnotebook.grad_sample.ghost.stale_records`: records that went stale
  (an input changed in place, a step without them), refused.

``from dpnotebook.grad_sample.ghost import GhostGradSampleModule`` (the old module's
path) still works: the wrapper's names are looked up on first use.
"""

from __future__ import annotations

from typing import Any

_WRAPPER_NAMES = ("GhostGradSampleModule", "ghost_owner")


def __getattr__(name: str) -> Any:
    if name in _WRAPPER_NAMES:
        from dpnotebook.grad_sample.ghost import wrapper

        return getattr(wrapper, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
