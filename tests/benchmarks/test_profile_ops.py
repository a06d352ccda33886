"""The operations-per-step counter (``python -m dpnotebook.benchmarks --profile-ops``): what it counts, no timings."""

from __future__ import annotations

import pytest
import torch

from dpnotebook.benchmarks.__main__ import main
from dpnotebook.benchmarks.profile_ops import count_ops, profile_table
from dpnotebook.benchmarks.steps import make_step


def test_a_foreach_op_counts_once_and_views_not_at_all() -> None:
    tensors = [torch.ones(3) for _ in range(5)]
    assert count_ops(lambda: torch._foreach_add_(tensors, 1.0)).total == 1  # five add_ on the CPU, one kernel on a GPU
    x = torch.ones(4, 6)
    assert count_ops(lambda: x.view(6, 4).t().unsqueeze(0)).total == 0
    assert dict(count_ops(lambda: (x @ x.t()) / 2).ops) == {"aten::mm": 1, "aten::div": 1}  # the scalar's copy is not


def test_a_dp_step_counts_more_than_the_plain_step() -> None:
    plain = count_ops(make_step("MLP", "nonprivate", batch=2)).total
    private = count_ops(make_step("MLP", "dpsgd_hooks", batch=2)).total
    assert 0 < plain < private


def test_host_reads_are_counted() -> None:
    x = torch.ones(3)
    assert count_ops(lambda: (x.sum().item(), bool(x.any()), x.tolist(), float(x[0]))).host_reads == 4
    assert count_ops(lambda: x + 1).host_reads == 0


@pytest.mark.parametrize("mode", ["hooks", "ew", "functorch", "ghost"])
def test_a_dp_step_reads_the_host_once(mode: str) -> None:
    """Only the finite-norm check reads back; the step's statistics wait until someone asks for them."""
    step = make_step("SampleConvNet", f"dpsgd_{mode}", batch=3)
    assert count_ops(step).host_reads == 1


def test_the_table_has_dpnotebook_and_opacus_side_by_side() -> None:
    table = profile_table(["MLP"], ["hooks"], batch=2)
    head, rule, row = table.splitlines()
    assert "hooks (dpn / Opacus)" in head and "best (dpn / Opacus)" in head
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "MLP" and cells[1].endswith("(0)") and int(cells[1].split()[0]) > 0
    ours, theirs = (int(v.split(" (")[0]) for v in cells[2].split(" / "))  # Opacus 1.6 is in the dev install
    assert ours > 0 and theirs > 0 and cells[2].count("(") == 2


def test_cli_prints_the_table(capsys) -> None:
    assert main(["--profile-ops", "--models", "MLP", "--modes", "ghost", "--profile-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "ghost (dpn / Opacus)" in out and "| MLP |" in out
