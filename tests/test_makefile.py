"""The two entry points: ``make lab`` installs only what a learner needs, ``make test`` the toolchain; both idempotent.

Run as ``make -n`` (print, do not run) in a copy of the three files the install depends on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def dry_run(project: Path, target: str) -> list[str]:
    # run as if from a shell even inside `make test`: a parent make's MAKEFLAGS/MAKELEVEL would make this
    # one print "make[1]: Entering/Leaving directory" lines among the commands
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target], cwd=project, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_make_lab_installs_the_lab_extra_only(project: Path) -> None:
    lines = dry_run(project, "lab")
    installs = [line for line in lines if "pip install" in line]
    assert any('-e ".[lab]"' in line for line in installs), lines
    assert not any(".[dev]" in line or ".[test]" in line for line in installs), lines
    assert lines[-1].startswith(".venv/bin/jupyter lab")


def test_make_test_installs_the_developer_toolchain(project: Path) -> None:
    assert any('-e ".[dev]"' in line for line in dry_run(project, "test"))


@pytest.mark.parametrize(("target", "stamp"), [("lab", ".installed-lab"), ("install", ".installed")])
def test_each_install_has_its_own_stamp_and_runs_once(project: Path, target: str, stamp: str) -> None:
    (project / ".venv").mkdir()
    other = ".installed" if stamp == ".installed-lab" else ".installed-lab"
    (project / ".venv" / other).touch()  # the other install done: this one still runs
    assert any("pip install" in line for line in dry_run(project, target))
    (project / ".venv" / stamp).touch()
    later = time.time() + 10  # the stamp newer than its sources: nothing to install
    os.utime(project / ".venv" / stamp, (later, later))
    assert not any("pip install" in line for line in dry_run(project, target))
    (project / "pyproject.toml").touch()
    os.utime(project / "pyproject.toml", (later + 10, later + 10))  # a changed dependency list: install again
    assert any("pip install" in line for line in dry_run(project, target))


def test_make_test_fast_is_the_quick_loop_and_make_test_the_whole_suite(project: Path) -> None:
    fast = dry_run(project, "test-fast")
    assert any('-e ".[dev]"' in line for line in fast), fast
    assert fast[-2:] == [".venv/bin/python -m ruff check .", '.venv/bin/python -m pytest -m "not slow" -n auto'], fast
    assert dry_run(project, "test")[-1] == ".venv/bin/python -m pytest", "make test runs every test, slow ones too"
