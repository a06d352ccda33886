"""The package ships ``py.typed`` (PEP 561), so users' type checkers read dpnotebook's annotations.

The wheel is built from a copy of the sources (``pyproject.toml``, ``README.md``, ``LICENSE``,
``dpnotebook/``) with setuptools' own build backend, offline, in about two seconds.
"""

from __future__ import annotations

import importlib.resources
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_holds_py_typed() -> None:
    marker = importlib.resources.files("dpnotebook").joinpath("py.typed")
    assert marker.is_file(), "dpnotebook/py.typed is missing: without it type checkers ignore the annotations"


def test_the_built_wheel_ships_py_typed(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "dpnotebook", tmp_path / "dpnotebook", ignore=shutil.ignore_patterns("__pycache__"))
    build = "from setuptools import build_meta; build_meta.build_wheel('dist')"
    done = subprocess.run([sys.executable, "-c", build], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("dpnotebook-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dpnotebook/py.typed" in names, sorted(n for n in names if not n.endswith(".py"))
    assert "dpnotebook/grad_sample/_engine/hooks.py" in names  # the subpackages are in it too
