"""The quick loop (``make test-fast``: ``pytest -m "not slow"``) cannot silently start running the slow tests.

The root ``conftest.py`` marks every notebook cell (nbval) and every test in ``tests.slow.SLOW_FOLDERS``
``slow``; single slow tests elsewhere carry ``@pytest.mark.slow``. Here a separate pytest collects
with ``-m "not slow"`` and must find none of them; and every test module that starts processes
(the distributed launcher), a browser or a Sphinx build must be in a slow folder or carry the mark.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.slow import SLOW_FOLDERS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))

#: What makes a test module slow by what it calls: the distributed launcher, a real browser, a Sphinx build.
SLOW_CALLS = {
    "run_on_ranks(": "starts one process per rank",
    "sync_playwright": "drives a real browser",
    '"sphinx"': "builds the documentation",
}


def test_slow_is_a_registered_marker() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^markers = \["slow: ', text, re.M) and "--strict-markers" in text


def collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def marked_slow(path: Path) -> set[str]:
    """The test functions of ``path`` that carry ``@pytest.mark.slow`` (all of them with a module ``pytestmark``)."""
    tree = ast.parse(path.read_text())
    tests = {
        node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    }
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node) == "pytestmark = pytest.mark.slow":
            return set(tests)
    return {
        name for name, node in tests.items() if any(ast.unparse(d) == "pytest.mark.slow" for d in node.decorator_list)
    }


def test_the_quick_loop_collects_no_notebook_cell_no_slow_folder_and_no_test_marked_slow() -> None:
    files = sorted(p for p in (ROOT / "tests").rglob("test_*.py") if marked_slow(p))
    assert files, "no test module carries @pytest.mark.slow"
    slow = {(p, name) for p in files for name in marked_slow(p)}
    done = collect("-m", "not slow", "tutorials", *SLOW_FOLDERS, *(str(p.relative_to(ROOT)) for p in files))
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert not [i for i in ids if ".ipynb::" in i], (
        "notebook cells in the quick loop: conftest.py's is_slow missed them"
    )
    assert not [i for i in ids if i.startswith(tuple(f + "/" for f in SLOW_FOLDERS))]
    names = {f"{p.relative_to(ROOT).as_posix()}::{name}" for p, name in slow}
    leaked = [i for i in ids if i.split("[")[0] in names]
    assert leaked == [], "tests marked slow are collected by the quick loop"
    deselected = re.search(r"(\d+) deselected", done.stdout)
    cells = sum(c["cell_type"] == "code" for nb in NOTEBOOKS for c in json.loads(nb.read_text())["cells"])
    assert deselected and int(deselected.group(1)) >= cells + len(slow), done.stdout[-500:]


def test_launcher_browser_and_sphinx_run_only_in_slow_tests() -> None:
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if relative.startswith(tuple(f + "/" for f in SLOW_FOLDERS)) or path.name == Path(__file__).name:
            continue
        for call, why in SLOW_CALLS.items():
            if call in text and "pytest.mark.slow" not in text:
                unmarked.append(
                    f"{relative} {why} ({call}): mark its tests @pytest.mark.slow or move it to a slow folder"
                )
    assert unmarked == []
