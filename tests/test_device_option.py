"""``pytest --device cuda``: the tests' tensors are made on the GPU, or every test is skipped with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.device import no_gpu_reason

ROOT = Path(__file__).resolve().parents[1]


def test_tensors_are_made_on_the_session_device(device: torch.device) -> None:
    assert torch.ones(1).device.type == device.type
    seeded = torch.randn(3, generator=torch.Generator().manual_seed(0))  # drawn on the CPU: the same numbers
    assert seeded.device.type == device.type
    assert torch.equal(seeded.cpu(), torch.randn(3, generator=torch.Generator().manual_seed(0), device="cpu"))


@pytest.mark.slow  # runs pytest in a subprocess
def test_device_cuda_runs_on_the_gpu_or_skips_everything_with_one_line() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--device",
            "cuda",
            "-q",
            "-p",
            "no:randomly",
            f"{Path(__file__).name}::test_tensors_are_made_on_the_session_device",
        ],
        cwd=ROOT / "tests",
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    reason = no_gpu_reason()
    if reason is None:
        assert "1 passed" in out, out
    else:
        lines = [line for line in out.splitlines() if line.startswith("--device cuda: all")]
        assert lines == [f"--device cuda: all 1 tests SKIPPED, none ran: {reason}"], out
        assert "1 skipped" in out and "passed" not in out, out
