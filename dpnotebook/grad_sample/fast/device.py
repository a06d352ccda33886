"""Per-device choices of the fast seam: what was measured on a CPU decides only CPU runs.

The shape rules and scratch budgets of the per-sample kernels were tuned on a
2-core CPU, where cache sizes and page faults decide (:mod:`~dpnotebook.grad_sample.fast.conv`'s
im2col thresholds and 8 MB chunks, the 32 MB chunks of the ghost linear norms).
On a GPU the kernels are small and launch-bound: what costs is the number of
calls. So a tensor on any other device gets a rule of its own, kept simple
because it is **not measured** (no GPU was available when it was written):

* convolutions: the grouped weight-gradient call (one cuDNN call per chunk) for
  every layer (:data:`ACCELERATOR_CONV_METHOD`), the same numbers as every other
  method (the tests check all three against the formula);
* scratch: chunks of up to :data:`ACCELERATOR_SCRATCH_BYTES`, so that a batch
  takes one or a few calls instead of one per few megabytes.

``set_conv_method("timed")`` times the methods on the device itself and so
applies on a GPU as measured there.

>>> import torch
>>> tuned_here(torch.ones(1)), scratch_bytes(8 * 2**20, torch.ones(1)) == 8 * 2**20
(True, True)
>>> scratch_bytes(8 * 2**20, torch.ones(1, device="meta")) == ACCELERATOR_SCRATCH_BYTES
True
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["ACCELERATOR_CONV_METHOD", "ACCELERATOR_SCRATCH_BYTES", "tuned_here", "scratch_bytes"]

#: The convolution method on a non-CPU device under the default ``"shapes"`` policy (unmeasured).
ACCELERATOR_CONV_METHOD = "grouped"
#: Scratch budget per chunk on a non-CPU device (unmeasured): a GPU holds this easily, and fewer
#: chunks mean fewer kernel launches.
ACCELERATOR_SCRATCH_BYTES = 256 * 2**20


def tuned_here(t: Tensor) -> bool:
    """Whether ``t`` is on the CPU, where the shape rules and budgets were measured."""
    return t.device.type == "cpu"


def scratch_bytes(cpu_budget: int, t: Tensor) -> int:
    """The scratch budget for work on ``t``: the measured CPU budget on the CPU, the accelerator's elsewhere."""
    return cpu_budget if tuned_here(t) else max(cpu_budget, ACCELERATOR_SCRATCH_BYTES)
