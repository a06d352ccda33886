"""Ghost records that went stale: refused, since the norms and sums they give would be wrong.

A record (:class:`~dpnotebook.grad_sample.ghost.groups.GhostCall`) keeps what a
layer saw until its backprops arrive and the optimizer step uses both. It goes
stale when a layer's input is modified in place after the layer used it (its
backprops then arrive for an input that is no longer there:
:func:`check_inputs_unchanged`), or when the parameters change under records
that were never used (:class:`StaleRecordsGuard`).

In ghost mode ``p.grad`` is not filled: a batch's clipped gradients exist only
as the wrapper's records (:mod:`~dpnotebook.grad_sample.ghost.ledger`) until a
:class:`~dpnotebook.privacy.GhostDPOptimizer` step uses them
and ``zero_grad()`` clears them. While an earlier batch's records are held, a
new forward pass is refused when

* gradient accumulation is forbidden: the records would mix two batches; or
* the ghosted layers' parameters changed since that batch began: an optimizer
  stepped without the clipped gradients, and the records no longer describe
  the model.

>>> import torch
>>> from torch import nn
>>> layer = nn.Linear(2, 1)
>>> guard = StaleRecordsGuard([layer])
>>> guard.new_batch()                                   # the batch's first record
>>> guard.check(holds_records=True, allow_accumulation=True)
>>> with torch.no_grad():
...     _ = layer.weight.add_(1.0)                      # a step that went without the records
>>> guard.check(holds_records=True, allow_accumulation=True)
Traceback (most recent call last):
...
dpnotebook.errors.GradSampleError: ghost mode: the parameters changed after a backward pass ...
"""

from __future__ import annotations

from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample.engine.functorch_fallback import LayerCall

__all__ = ["StaleRecordsGuard", "input_versions", "check_inputs_unchanged"]


def input_versions(call: LayerCall) -> list[int]:
    """The version counters of ``call``'s tensor inputs (taken when the layer ran)."""
    return [a._version for a in call.args if isinstance(a, Tensor)]


def check_inputs_unchanged(call: LayerCall, versions: list[int]) -> None:
    """Raise if an input of ``call`` was modified in place since :func:`input_versions` gave ``versions``.

    Raises:
        GradSampleError: an input changed; the layer's record no longer matches its backprops.
    """
    if input_versions(call) != versions:
        raise GradSampleError(
            f"{call.path} ({type(call.module).__name__}): its input was modified in place after the layer "
            "used it, so ghost mode cannot compute its gradient norms. Avoid in-place operations on "
            "layer inputs (e.g. use ReLU(inplace=False) before this layer)."
        )


class StaleRecordsGuard:
    """The ghosted layers' parameter versions when a batch's first record came, checked before a forward pass.

    Args:
        layers: the ghosted layers (their parameters are read at each use: a parameter may be replaced).
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers
        self.versions: dict[int, int] = {}

    def _params(self) -> list[nn.Parameter]:
        return [p for m in self.layers for p in m._parameters.values() if p is not None]

    def new_batch(self) -> None:
        """Remember the parameters' versions (called when a batch's first record arrives)."""
        self.versions = {id(p): p._version for p in self._params()}

    def forget(self) -> None:
        """The records were cleared: there is nothing left to go stale."""
        self.versions = {}

    def check(self, holds_records: bool, allow_accumulation: bool) -> None:
        """Raise if the records held (``holds_records``) went stale (see the module docstring).

        Raises:
            GradSampleError: accumulation is forbidden, or the parameters changed since the batch began.
        """
        if not holds_records:
            return
        if not allow_accumulation:
            raise GradSampleError(
                "ghost mode holds the norms of an earlier batch and gradient accumulation is forbidden. "
                "Call zero_grad() (on the model or the DP optimizer) before the next forward/backward, "
                "or call allow_grad_accumulation()."
            )
        for p in self._params():
            if id(p) in self.versions and p._version != self.versions[id(p)]:
                raise GradSampleError(
                    "ghost mode: the parameters changed after a backward pass whose clipped gradients "
                    "were never used, so an optimizer stepped without them (in ghost mode p.grad is "
                    "not filled). Use dpnotebook.privacy.GhostDPOptimizer, e.g. through "
                    "PrivacyEngine.make_private(grad_sample_mode='ghost'), or call zero_grad() between steps."
                )
