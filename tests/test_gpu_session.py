"""``tools/gpu-session``, the prepared run of a lent GPU machine: its plumbing, checked without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu-session"


def run(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), str(out), *args],
        env={**os.environ, "PY": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU: the session would really run")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path) -> None:
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "summary.md").read_text() == "no CUDA GPU here: nothing run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]


@pytest.mark.slow  # five stages, each cut off by its share of a 10-second budget
def test_a_dry_run_on_the_cpu_records_every_stage_within_its_share(tmp_path) -> None:
    done = run(tmp_path, "10", DEVICE="cpu")
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.md").read_text()
    rows = [line.split(" | ") for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r[0].strip("| ") for r in rows] == ["tests", "tutorials", "benchmarks", "profile", "rnn_speed"]
    # each stage stops at its share (3, 2, 3, 1 and 1 s: at least one) plus the kill's grace
    for (_, rc, seconds, _), share in zip(rows, (3, 2, 3, 1, 1), strict=True):
        assert rc.startswith(("0", "1", "124")) and int(seconds) <= share + 11
    assert "on the CPU" in summary and {p.name for p in tmp_path.iterdir()} >= {"tests.log", "benchmarks.log"}
    # each log starts with its command: the Makefile's GPU test paths, the tutorials apart
    command = (tmp_path / "tests.log").read_text().splitlines()[0].split()
    assert command[:4] == ["$", sys.executable, "-m", "pytest"] and "--device" in command
    assert "tests/privacy" in command and "tests/distributed" in command and "tutorials" not in command
    assert "--failures-at-once" in command  # a stage cut off by its limit still shows why its tests failed
    tutorials = (tmp_path / "tutorials.log").read_text().splitlines()[0]
    assert tutorials.endswith(" --dist loadfile tutorials")  # each notebook's cells on one worker, in order
    assert len(list(tmp_path.iterdir())) <= 8  # a device call brings back at most 8 files


@pytest.mark.slow  # one stage, the whole 3-second budget its own
def test_stages_picks_some_and_shares_the_budget_among_them(tmp_path) -> None:
    done = run(tmp_path, "3", DEVICE="cpu", STAGES="rnn_speed")
    assert done.returncode == 0, done.stderr
    rows = [line for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| rnn_speed")]
    assert len(rows) == 1 and not (tmp_path / "tests.log").exists()
    assert "timed out at 3 s" in rows[0] or rows[0].split(" | ")[1] == "0"
    bad = run(tmp_path, "3", DEVICE="cpu", STAGES="tests bench")
    assert bad.returncode == 2 and "unknown stage 'bench'" in bad.stderr


@pytest.mark.slow  # two stages of a 4-second budget, split 3 : 1 by SHARES rather than 5 : 10
def test_shares_changes_each_stages_part_of_the_budget(tmp_path) -> None:
    done = run(tmp_path, "4", DEVICE="cpu", STAGES="profile rnn_speed", SHARES="profile=1 rnn_speed=3")
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "timed out at 1 s" in summary and "timed out at 3 s" in summary  # neither finishes in its part
    for pair in ("profile=0", "bench=5", "profile"):
        bad = run(tmp_path, "4", DEVICE="cpu", SHARES=pair)
        assert bad.returncode == 2 and f"SHARES: '{pair}'" in bad.stderr


def test_the_wheels_to_carry_are_what_the_machine_lacks_and_never_torch(tmp_path, capsys) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_wheels
    finally:
        sys.path.remove(str(SCRIPT.parent))
    listed = tmp_path / "have.txt"
    listed.write_text("Package Version\n------- -------\nnumpy 2.5.2\nScipy 1.16\ntqdm\n")
    wanted = gpu_wheels.main([str(tmp_path / "whl"), "--have", str(listed), "--dry-run"])
    names = {w.split("==")[0] for w in wanted}
    assert {"dp-accounting", "opacus", "nbval", "ipywidgets", "opt-einsum"} <= names
    assert not names & {"torch", "triton", "numpy", "scipy", "tqdm", "dpnotebook"}
    assert not any(n.startswith("nvidia-") for n in names)
    assert capsys.readouterr().out.split() == wanted and not (tmp_path / "whl").exists()  # a dry run downloads nothing


def test_the_host_profile_has_a_row_per_configuration_and_says_what_failed() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import host_profile
    finally:
        sys.path.remove(str(SCRIPT.parent))
    report = host_profile.table(["MLP"], 4, ["nonprivate", "dpsgd_ghost", "no_such_step"], "cpu", steps=2)
    rows = {r.split(" | ")[1]: r.strip("| ").split(" | ") for r in report.splitlines() if r.startswith("| MLP ")}
    assert set(rows) == {"nonprivate", "dpsgd_ghost", "no_such_step"}
    plain, ghost = rows["nonprivate"], rows["dpsgd_ghost"]
    assert plain[3:7] == ["—"] * 4  # no device on the CPU
    assert 0 < float(plain[2]) and float(plain[8]) < float(ghost[8])  # the DP step runs more library Python
    assert rows["no_such_step"][2].startswith("ValueError")
    assert "- MLP dpsgd_ghost: operators (self host ms)" in report and "dpnotebook/privacy/" in report


def test_failures_at_once_reports_each_failure_before_the_run_ends(tmp_path) -> None:
    """The third GPU run's test stage was cut off by its limit before pytest printed any failure's report:
    21 tests failed with no reason shown. With ``--failures-at-once`` (the root conftest.py) each report
    is written, and flushed, when the failure arrives, also from xdist workers; the stages pass it.

    Here a second test waits until this test has read the first one's report from the run's stdout (a
    pipe, so buffered: no PYTHONUNBUFFERED), and passes only if it is released within a minute."""
    release = tmp_path / "release"
    (tmp_path / "test_planted.py").write_text(
        "import pathlib, time\n\ndef test_fails():\n    assert 1 + 1 == 3, 'planted failure'\n\n"
        "def test_waits_for_the_report():\n    deadline = time.monotonic() + 60\n"
        f"    while not pathlib.Path({str(release)!r}).exists():\n"
        "        assert time.monotonic() < deadline, 'the report did not arrive while this test ran'\n"
        "        time.sleep(0.1)\n"
    )
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "--failures-at-once", "-n", "2", "--tb=short"]
    command += ["-p", "no:cacheprovider", "-o", "addopts=", "test_planted.py"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(SCRIPT.parent.parent)
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    assert run.stdout is not None
    for line in run.stdout:
        seen.append(line)
        if "planted failure" in line and any("--- failed at once: test_planted.py::test_fails" in s for s in seen):
            release.touch()  # the report came while the other test still waited
    run.wait(timeout=120)
    out = "".join(seen)
    assert "1 failed, 1 passed" in out, out  # released in time: the report was not held back to the end


def _read_counter(monkeypatch) -> list[int]:
    reads = [0]
    real = torch.Tensor.__float__

    def counted(self):  # the step's one host read is float(norms.sum())
        reads[0] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "__float__", counted)
    return reads


def test_graph_bound_takes_the_host_read_away_only_inside_its_block(monkeypatch) -> None:
    """tools/graph_bound.py: a CUDA graph cannot read the device, so its ``no_read`` block answers the
    finite-norm check without reading; outside the block the check reads again (and still drops NaNs)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import graph_bound
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from dpnotebook.benchmarks.steps import make_step
    from dpnotebook.errors import PrivacyWarning
    from dpnotebook.privacy import _mechanisms

    reads = _read_counter(monkeypatch)
    for what in ("dpsgd_ghost", "dpsgd_hooks"):
        step = make_step("MLP", what, 4)
        step()
        reads[0] = 0
        step()
        assert reads[0] == 1, what  # the one read of an ordinary step
        with graph_bound.no_read():
            step()
        assert reads[0] == 1, what  # none inside the block
    with pytest.warns(PrivacyWarning, match="1 sample"):  # the real check is back, warning included
        assert _mechanisms.nonfinite_mask(torch.tensor([1.0, float("nan")])) is not None


@pytest.mark.slow  # two configurations of the MLP, each in a process of its own
def test_graph_bound_prints_a_row_per_configuration_on_the_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "graph_bound.py"), "--device", "cpu", "--models", "MLP"]
        + ["--batch", "4", "--rounds", "2", "--configs", "dpsgd_ghost", "no_such_step"],
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parent.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| MLP | 4 |")]
    assert len(rows) == 1 and rows[0].startswith("| MLP | 4 | dpsgd_ghost | ") and rows[0].endswith("| — | — |")
    assert "no_such_step: exit 1: ValueError: configuration 'no_such_step' is unknown" in done.stdout
