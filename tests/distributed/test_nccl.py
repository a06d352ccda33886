"""The noise-once property with NCCL, one GPU per rank, where the machine has at least two GPUs.

Everything else in ``tests/distributed`` runs with gloo on the CPU on every machine. On a machine
with fewer than two CUDA GPUs (every machine this project has had, including its one-GPU loans)
this module is skipped and says why.
"""

from __future__ import annotations

import pytest
import torch

from dpnotebook.privacy import run_on_ranks
from tests.distributed import workers

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 2, reason=f"NCCL needs two CUDA GPUs; this machine has {GPUS}")

STEPS, SIGMA, C = 40, 1.3, 0.7


def test_nccl_adds_the_noise_once_per_step() -> None:
    outcomes = run_on_ranks(
        workers.cuda_zero_gradient_noise, world_size=2, args=(STEPS, SIGMA, C), backend="nccl", timeout_s=180
    )
    for outcome in outcomes:
        assert outcome.error is None, outcome.traceback
    grads = [o.value["grads"] for o in outcomes]
    assert torch.equal(grads[0], grads[1])
    target = SIGMA * C / outcomes[0].value["expected_batch_size"]
    assert abs(float(grads[0].std()) / target - 1) < 0.03  # 8 standard errors; sqrt(2) too large if drawn twice
