"""The revision comparison: its arithmetic, and one tiny HEAD-against-HEAD run (no timing is asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dpnotebook.benchmarks.__main__ import configurations, parse_args
from dpnotebook.benchmarks.revisions import compare, main, table

REPO = Path(__file__).resolve().parents[2]


def test_compare_pairs_rounds_and_says_when_the_spread_misses_one() -> None:
    r = compare([10.0, 20.0, 30.0], [12.0, 22.0, 36.0])  # per round 1.2, 1.1, 1.2
    assert r["median_a"] == 20.0 and r["median_b"] == 22.0
    assert r["ratio"] == pytest.approx(1.1)
    assert (r["ratio_min"], r["ratio_max"]) == (pytest.approx(1.1), pytest.approx(1.2))
    assert r["within_noise"] is False
    r = compare([10.0, 10.0], [9.0, 11.0])
    assert (r["ratio_min"], r["ratio_max"], r["within_noise"]) == (0.9, 1.1, True)
    with pytest.raises(ValueError, match="one time per round"):
        compare([1.0, 2.0], [1.0])


def test_table_shows_errors_and_the_spread() -> None:
    mlp = {"model": "MLP", "batch": 8, "K": 1}
    rows = [
        {**mlp, "what": "nonprivate", **compare([2.0], [3.0]), "fastest_ratio": 1.25},
        {**mlp, "what": "dpsgd_ghost", **compare([4.0], [4.0]), "rel": compare([2.0], [1.9]), "fastest_ratio": 1.0},
        {**mlp, "what": "gsm_new", "error": "ValueError: unknown mode"},
    ]
    lines = table(rows, "A", "B").splitlines()
    assert lines[2] == "| MLP B=8 K=1 nonprivate | 2.0 | 3.0 | 1.50 | 1.50-1.50 | no | — | 1.25 |"
    assert lines[3].endswith("| 1.00 | 1.00-1.00 | yes | 0.95 (0.95-0.95) | 1.00 |")
    assert "error: ValueError: unknown mode" in lines[4]


def test_the_suite_options_plan_the_suite_configurations() -> None:
    configs = configurations(parse_args(["--quick"]))
    assert ("SampleConvNet", 32, 16, "dpsgd_ghost") in [(c.model, c.batch, c.K, c.what) for c in configs]
    assert all(c.batch == 128 for c in configs if c.model != "SampleConvNet")


@pytest.mark.slow  # exports two git revisions and times them, in fresh processes
@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git checkout")
def test_head_against_head_on_one_tiny_configuration(tmp_path, capsys) -> None:
    out = tmp_path / "revisions.json"
    argv = ["HEAD", "HEAD", "--rounds", "1", "--repo", str(REPO), "--json", str(out)]
    argv += ["--models", "MLP", "--batch", "4", "--modes", "ghost", "--kinds", "dpsgd", "--ks", "1"]
    argv += ["--steps", "1", "--min-seconds", "0", "--warmup", "0", "--threads", "1", "--device", "cpu"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert data["revisions"]["a"]["commit"] == data["revisions"]["b"]["commit"] == head.strip()
    for side in ("a", "b"):
        imported = Path(data["revisions"][side]["dpnotebook"])
        assert not imported.is_relative_to(REPO) and not imported.exists()  # the exported tree, removed after
    assert [r["what"] for r in data["rows"]] == ["nonprivate", "dpsgd_ghost"]
    for r in data["rows"]:
        assert "error" not in r, r
        assert r["median_a"] > 0 and r["median_b"] > 0 and r["ratio"] > 0 and r["fastest_ratio"] > 0
        assert r["ratio_min"] == r["ratio_max"] == pytest.approx(r["ratio"])  # one round
        assert len(r["a_runs"]) == len(r["b_runs"]) == 1
    assert "rel" not in data["rows"][0] and data["rows"][1]["rel"]["ratio"] > 0
    printed = capsys.readouterr().out
    assert "| MLP B=4 K=1 dpsgd_ghost |" in printed and "ratio B/A" in printed
    assert main(["--report", str(out)]) == 0 and capsys.readouterr().out.strip() == printed.strip()
