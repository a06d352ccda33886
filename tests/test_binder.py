"""Binder's pinned environment agrees with pyproject.toml, and every badge comes from its URL."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from dpnotebook.binder import badge_markdown, binder_url

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def binder_pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"binder pins exact versions; {line!r} does not"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def runtime_requirements() -> list[Requirement]:
    """The package's dependencies plus the widgets and lab extras (what the tutorials need)."""
    project = PYPROJECT["project"]
    names = list(project["dependencies"])
    for extra in ("widgets", "lab"):
        names += [r for r in project["optional-dependencies"][extra] if not r.startswith("dpnotebook")]
    return [Requirement(r) for r in names]


@pytest.mark.parametrize("req", runtime_requirements(), ids=str)
def test_binder_pins_every_runtime_requirement_compatibly(req: Requirement) -> None:
    pins = binder_pins()
    name = canonicalize_name(req.name)
    assert name in pins, f"binder/requirements.txt does not pin {req.name} (pyproject.toml asks for {req})"
    # local version labels such as +cpu do not change compatibility
    assert req.specifier.contains(Version(pins[name].public), prereleases=True), (
        f"binder pins {req.name}=={pins[name]}, which pyproject.toml's {req} excludes"
    )


def test_binder_torch_matches_the_constraints_file() -> None:
    constraint = (ROOT / "constraints.txt").read_text()
    pinned = re.search(r"^torch==(\S+)", constraint, re.M).group(1)
    assert binder_pins()["torch"].public == pinned


def test_binder_python_and_install_step() -> None:
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    post = ROOT / "binder" / "postBuild"
    assert post.stat().st_mode & 0o111, "postBuild must be executable"
    assert "pip install --no-deps" in post.read_text()


@pytest.mark.parametrize("path", sorted((ROOT / "tutorials").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_tutorial_has_its_own_binder_badge(path: Path) -> None:
    first = nbformat.read(path, as_version=4).cells[0]
    assert badge_markdown(path.name) in first.source, f"run `make badges`: {path.name} has no current badge"


def test_readme_badge_and_url_from_pyproject() -> None:
    assert badge_markdown() in (ROOT / "README.md").read_text()
    repo = PYPROJECT["project"]["urls"]["Repository"].rstrip("/")
    owner_repo = repo.removeprefix("https://github.com/")
    assert binder_url().startswith(f"https://mybinder.org/v2/gh/{owner_repo}/main")
