"""The old flat ``dpnotebook.grad_sample`` paths still import, and nothing of ours uses them."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dpnotebook.grad_sample.moved import MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_moved_module_and_names_the_new_path(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new and module.__spec__.name == MOVED[old]
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(MOVED[old] in m for m in messages), messages


def test_old_attribute_paths_and_the_ghost_wrapper_names() -> None:
    import dpnotebook.grad_sample as grad_sample
    from dpnotebook.grad_sample import GhostGradSampleModule
    from dpnotebook.grad_sample.ghost import _wrapper as wrapper

    with pytest.warns(DeprecationWarning, match="samplers.lora"):
        assert grad_sample.__getattr__("lora") is importlib.import_module("dpnotebook.grad_sample.samplers.lora")
    assert GhostGradSampleModule is wrapper.GhostGradSampleModule
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        grad_sample.__getattr__("nonexistent")


def test_a_fresh_interpreter_warns_at_the_importing_line() -> None:
    code = "import warnings; warnings.simplefilter('always')\nimport dpnotebook.grad_sample.ghost_tap\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "<string>:2: DeprecationWarning: dpnotebook.grad_sample.ghost_tap moved to" in out.stderr, out.stderr


def test_nothing_in_the_repository_uses_an_old_path() -> None:
    """The package, tests, docs, examples and tutorials import from the new paths."""
    old_names = "|".join(re.escape(old.rsplit(".", 1)[1]) for old in MOVED)
    pattern = re.compile(rf"dpnotebook[./]grad_sample[./]({old_names})\b")
    mine = {Path(__file__).resolve(), (ROOT / "dpnotebook/grad_sample/moved.py").resolve()}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".ipynb", ".toml", ".cfg", ".txt"} or path.resolve() in mine:
            continue
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "old grad_sample paths (see dpnotebook/grad_sample/moved.py):\n" + "\n".join(found)
