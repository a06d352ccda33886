"""Per-device scratch budgets: what was measured on a CPU decides only CPU runs.

The chunk budgets of the per-sample kernels (8 MB of convolution samples, 32 MB
of ghost linear norms) were tuned on a 2-core CPU, where caches and page faults
decide. On a GPU the kernels are small and launch-bound, so a tensor on any
other device gets chunks of up to :data:`ACCELERATOR_SCRATCH_BYTES`: a batch
then takes one or a few calls.

>>> import torch
>>> scratch_bytes(8 * 2**20, torch.ones(1)) == 8 * 2**20
True
>>> scratch_bytes(8 * 2**20, torch.ones(1, device="meta")) == ACCELERATOR_SCRATCH_BYTES
True
"""

from __future__ import annotations

from torch import Tensor

#: Scratch budget per chunk on a non-CPU device: a GPU holds this easily, and fewer chunks mean fewer launches.
ACCELERATOR_SCRATCH_BYTES = 256 * 2**20


def scratch_bytes(cpu_budget: int, t: Tensor) -> int:
    """The scratch budget for work on ``t``: the measured CPU budget on the CPU, the accelerator's elsewhere."""
    return cpu_budget if t.device.type == "cpu" else max(cpu_budget, ACCELERATOR_SCRATCH_BYTES)


__all__ = ["ACCELERATOR_SCRATCH_BYTES", "scratch_bytes"]
