"""The one-process, interleaved DP-step table (``python -m dpnotebook.benchmarks.side_by_side``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpnotebook.benchmarks import side_by_side
from dpnotebook.benchmarks.side_by_side import Timed, best_ratio, time_row


def test_each_ratio_is_to_the_reference_timed_beside_it_and_a_failure_stays_a_row() -> None:
    rows = time_row("MLP", 3, ["nonprivate", "dpsgd_ghost", "dpsgd_nosuchmode"], rounds=2, warmup=0)
    assert [r.what for r in rows] == ["nonprivate", "dpsgd_ghost", "dpsgd_nosuchmode"]
    base, ghost, broken = rows
    assert base.ratio == 1.0 and ghost.ratio == pytest.approx(ghost.ms / base.ms)
    assert math.isnan(broken.ms) and "ValueError" in broken.error and "dpsgd_nosuchmode" in broken.error


def test_best_ratio_skips_what_did_not_run() -> None:
    rows = [
        Timed("m", 2, "nonprivate", 1.0, 1.0),
        Timed("m", 2, "dpsgd_hooks", 3.0, 3.0),
        Timed("m", 2, "dpsgd_ghost", 2.0, 2.0),
        Timed("m", 2, "opacus_dpsgd_hooks", math.nan, math.nan, "ImportError: no opacus"),
    ]
    assert best_ratio(rows, "dpsgd_") == 2.0
    assert math.isnan(best_ratio(rows, "opacus_"))


def test_the_command_line_prints_a_row_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    argv = "--models MLP --batch 2 --whats nonprivate dpsgd_ghost --rounds 2 --warmup 0 --device cpu --json".split()
    rows = side_by_side.main([*argv, str(out)])
    printed = capsys.readouterr().out
    assert "MLP B=2: nonprivate" in printed and "dpsgd_ghost" in printed
    saved = json.loads(out.read_text())
    assert saved["device"] == "cpu" and [r["what"] for r in saved["rows"]] == [r.what for r in rows]
