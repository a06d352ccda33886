"""No rule measured on a CPU decides a run on another device (dpnotebook/grad_sample/fast/device.py).

The "meta" device stands in for a GPU: shapes only, no data, and not the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from dpnotebook.grad_sample.fast.conv import CHUNK_BYTES, conv_method
from dpnotebook.grad_sample.fast.device import ACCELERATOR_CONV_METHOD, ACCELERATOR_SCRATCH_BYTES, scratch_bytes
from dpnotebook.grad_sample.samplers import linear_norm


def test_the_cpu_conv_rule_does_not_decide_another_device() -> None:
    layer = nn.Conv2d(16, 32, 4, 2)  # the CPU rule sends this one to im2col
    x, g = torch.empty(4, 16, 13, 13), torch.empty(4, 32, 5, 5)
    assert conv_method(layer, x, g, K=1) == "unfold"
    assert conv_method(layer, x.to("meta"), g.to("meta"), K=1) == ACCELERATOR_CONV_METHOD == "grouped"


def test_scratch_budgets_are_the_cpus_only_on_the_cpu() -> None:
    budget = max(CHUNK_BYTES, linear_norm.CHUNK_BYTES)
    assert scratch_bytes(budget, torch.empty(1)) == budget
    assert scratch_bytes(budget, torch.empty(1, device="meta")) == ACCELERATOR_SCRATCH_BYTES > budget
    per_sample = 2**20  # 4 MiB of float32 scratch per sample
    assert linear_norm._chunk(512, per_sample, torch.empty(1)) == 8
    assert linear_norm._chunk(512, per_sample, torch.empty(1, device="meta")) == 64
