"""The auditor itself: it measures the right thing, and it catches a step that breaks the bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import dpnotebook
from dpnotebook.audit import (
    FAMILIES,
    RECORDS,
    GridPoint,
    Outcome,
    SensitivityReport,
    audit_case,
    audit_sensitivity,
    grid,
    matches,
    run_point,
    summarise,
)
from dpnotebook.audit._cases import expected_refusal
from dpnotebook.grad_sample import unregister_grad_sampler
from dpnotebook.modes import available_modes

ROOT = str(Path(__file__).resolve().parents[2])


def _mlp_audit(**kwargs):
    case = audit_case("mlp", "scale_1e4")
    return audit_sensitivity(
        case.model(True),
        batch=lambda idx: case.batch(idx, K=1, batch_first=True),
        loss=case.loss(loss_reduction="sum", batch_first=True, K=1),
        num_samples=case.num_samples,
        loss_reduction="sum",
        max_grad_norm=0.01,
        **kwargs,
    )


def test_a_clipped_record_moves_the_sum_by_exactly_c() -> None:
    report = _mlp_audit()
    assert report.ok()
    assert report.max_ratio == pytest.approx(1.0, abs=1e-5)  # every sample is clipped at C = 0.01
    assert report.reference_gap < 1e-5
    assert "sensitivity audit: mode=hooks" in report.table()


def test_the_auditor_catches_clip_factors_from_half_the_norm(monkeypatch) -> None:
    import dpnotebook.privacy._mechanisms as clipping

    real = clipping.masked_clip_factors
    monkeypatch.setattr(clipping, "masked_clip_factors", lambda norms, C, finite: real(norms / 2, C, finite))
    report = _mlp_audit()
    assert not report.ok()
    assert report.max_ratio == pytest.approx(2.0, rel=1e-3)
    assert "<- over C" in report.table()


def test_the_grid_catches_a_mean_step_divided_by_the_rows_drawn(monkeypatch) -> None:
    # dividing by the batch drawn (data-dependent) shrinks every difference below C; the definition sees it
    from dpnotebook.privacy._optimizer import DPOptimizer

    rows = property(lambda opt: float(sum(int(n.shape[0]) for n in opt._norms)))
    monkeypatch.setattr(DPOptimizer, "mean_divisor", rows)
    outcome = run_point(GridPoint("hooks", "mlp", "gaussian", 1, "mean", "flat", True, 1))
    assert outcome.report is not None and outcome.report.max_ratio <= 1
    assert "differs from the float64 definition" in (matches(outcome) or "")


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 6))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.t()


def test_the_auditor_catches_a_sampler_that_mixes_rows() -> None:
    @dpnotebook.register_grad_sampler(Scaled)
    def mixed(layer: Scaled, activations: list, backprops: Tensor, K: int) -> dict:
        g = torch.einsum("bo,bi->boi", backprops, activations[0]).reshape(-1, K, 3, 6).mean(1)
        return {layer.weight: (g + g.roll(1, 0)) / 2}  # sample i gets half of sample i-1's gradient

    try:
        x = torch.randn(4, 6) * torch.tensor([1.0, 10.0, 100.0, 1000.0])[:, None]
        t = torch.randn(4, 3)
        report = audit_sensitivity(
            Scaled(),
            batch=lambda idx: (x[idx], t[idx]),
            loss=lambda m, b: (m(b[0]) * b[1]).sum(),
            num_samples=4,
            loss_reduction="sum",
            max_grad_norm=1.0,
        )
        assert report.max_ratio > 1.2  # one sample now moves two clipped rows
        assert report.reference_gap > 0.1  # and the rows are not the samples' gradients
    finally:
        unregister_grad_sampler(Scaled)


def test_every_record_builds_in_both_layouts() -> None:
    for record in RECORDS:
        case = audit_case("seq_linear", record)
        x, t = case.batch([0, 1], K=3, batch_first=False)
        assert x.shape[1] == 6 and t.shape[1] == 6


def test_the_empty_batch_is_audited() -> None:
    case = audit_case("mlp", "gaussian", num_samples=0)
    for mode in dpnotebook.available_modes():
        kwargs = dict(
            batch=lambda idx: case.batch(idx, K=1, batch_first=True),
            num_samples=0,
            mode=mode,
            loss=case.loss(loss_reduction="mean", batch_first=True, K=1),
        )
        if mode == "ew":
            with pytest.raises(Exception, match="empty"):
                audit_sensitivity(case.model(True), **kwargs)
            continue
        report = audit_sensitivity(case.model(True), **kwargs)
        assert report.ratios == [] and report.ok() and report.reference_gap == 0.0


def test_refusals_are_checked_both_ways() -> None:
    point = GridPoint("ew", "seq_linear", "gaussian", 1, "mean", "flat", False, 1)
    assert expected_refusal(point) is not None
    assert matches(run_point(point)) is None  # refused with the documented message
    allowed = GridPoint("hooks", "mlp", "gaussian", 1, "mean", "flat", True, 1)
    assert expected_refusal(allowed) is None and matches(run_point(allowed)) is None


def test_a_point_is_bounded_or_broken_by_its_dtypes_tolerance() -> None:
    # float32 allows C (1 + 1e-4); a point within it is "bounded", not "violated" and yet not broken
    point = GridPoint("hooks", "mlp", "gaussian", 1, "sum", "flat", True, 1, torch.float32)
    for ratio, status in ((1 + 5e-5, "bounded"), (1 + 2e-4, "violated")):
        outcome = Outcome(point, report=SensitivityReport({}, ratios=[ratio], movers=["w"], reference_gap=0.0))
        bounded = status == "bounded"
        assert outcome.status == status and (matches(outcome) is None) == bounded
        assert summarise([outcome]).splitlines()[1].split()[:5] == [
            "hooks",
            "1",
            str(int(bounded)),
            "0",
            str(1 - bounded),
        ]


@pytest.mark.slow  # runs twelve grid points
def test_summary_counts_points() -> None:
    outcomes = [run_point(p) for p in grid(modes=["functorch"], families=["norms"], records=["duplicated"])]
    text = summarise(outcomes)
    assert text.splitlines()[1].split()[:5] == ["functorch", "12", "12", "0", "0"]


def test_bad_num_samples_is_refused() -> None:
    with pytest.raises(ValueError, match=r"num_samples=-1 is invalid"):
        audit_sensitivity(nn.Linear(2, 2), batch=lambda i: None, loss=lambda m, b: None, num_samples=-1)


VIRTUAL = [
    (m, f) for m in dpnotebook.available_modes() for f in ("mlp", "embedding", "lstm") if (m, f) != ("ew", "lstm")
]


@pytest.mark.parametrize("mode,family", VIRTUAL)  # ew refuses DP layers by design (see test_grid.py)
def test_virtual_steps_keep_the_bound(mode: str, family: str) -> None:
    """A logical batch fed in pieces (virtual steps, as BatchMemoryManager does) is still one bounded sum."""
    case = audit_case(family, "scale_1e4")
    model = case.model(True).double()
    report = audit_sensitivity(
        model,
        num_samples=case.num_samples,
        mode=mode,
        K=3,
        loss_reduction="sum",
        max_grad_norm=0.01,
        batch=lambda idx: tuple(
            a.double() if a.is_floating_point() else a for a in case.batch(idx, K=3, batch_first=True)
        ),
        loss=case.loss(loss_reduction="sum", batch_first=True, K=3),
        physical_batch_size=3,
    )
    assert report.ok() and report.reference_gap < 1e-6, report.table()


@pytest.mark.slow  # runs an audit grid
def test_the_command_line_prints_a_summary(capsys) -> None:
    from dpnotebook.audit.__main__ import main

    assert main(["--mode", "hooks", "--family", "norms"]) == 0
    out = capsys.readouterr().out
    assert "hooks" in out and "0 break the promise" in out
    # float32 products rounded to bfloat16: ew refuses every point (by design), and the setting is put back
    assert main(["--float32", "--matmul-precision", "medium", "--mode", "ew", "--family", "mlp"]) == 0
    ew = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ew "))
    assert ew.split()[1] == ew.split()[3] != "0" and torch.backends.mkldnn.matmul.fp32_precision == "none"


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m dpnotebook.audit ARGS`` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "dpnotebook.audit", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow  # a fresh interpreter per command line
@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [("--mode", "bogus", lambda: available_modes()), ("--family", "linear", lambda: sorted(FAMILIES))],
)
def test_the_command_line_refuses_an_unknown_name_and_lists_the_valid_ones(option: str, value: str, valid) -> None:
    """A typo is a usage error (exit 2) naming the choices, not a grid of failures or a traceback."""
    result = _cli(option, value)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"argument {option}: invalid choice: '{value}'" in result.stderr
    assert all(f"'{name}'" in result.stderr for name in valid()), result.stderr
    assert "Traceback" not in result.stderr and "break the promise" not in result.stdout


@pytest.mark.slow  # a fresh interpreter per command line
def test_the_command_lines_help_lists_the_modes_and_families() -> None:
    result = _cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps the lines
    assert "one of: " + ", ".join(available_modes()) in text
    assert "one of: " + ", ".join(sorted(FAMILIES)) in text


@pytest.mark.slow  # runs an audit grid
def test_the_command_line_runs_a_small_grid_with_its_progress_bar() -> None:
    result = _cli("--mode", "hooks", "--family", "norms", "--progress")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 break the promise" in result.stdout
    assert "audit grid" in result.stderr and "point" in result.stderr  # tqdm's bar, on stderr


def test_the_grid_refuses_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"mode='bogus' is unknown; choose one of \['ew'"):
        list(grid(modes=["bogus"]))
