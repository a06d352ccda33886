"""The conventions every tutorial follows (docs/tutorials.md), checked on the committed notebooks without running them.

- nbval markers are cell tags (``nbval-ignore-output``, ``nbval-skip``, ``raises-exception``), never
  ``# NBVAL_*`` comments in code a learner reads;
- assertions that keep the prose true of the output sit in their own cells tagged ``remove-cell``
  (hidden on the documentation site, run by nbval), never in a learner's cell;
- every notebook picks its device with ``dpnotebook.default_device()`` and so says which it runs on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))
_ASSERT = re.compile(r"^\s*assert\b", re.M)


def _code_cells(notebook: Path) -> list[tuple[int, str, list[str]]]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [
        (i, "".join(c["source"]) if isinstance(c["source"], list) else c["source"], c["metadata"].get("tags", []))
        for i, c in enumerate(cells)
        if c["cell_type"] == "code"
    ]


def _violations(notebook: Path) -> list[str]:
    found = []
    cells = _code_cells(notebook)
    for i, source, tags in cells:
        if "# NBVAL_" in source:
            found.append(f"cell {i}: a '# NBVAL_*' comment; use the cell tag instead (e.g. nbval-ignore-output)")
        if _ASSERT.search(source) and "remove-cell" not in tags and "exercise" not in tags:
            found.append(f"cell {i}: an assert in a learner's cell; move it to a cell tagged remove-cell")
    # torch work goes through default_device(); a notebook that computes with NumPy alone (03b) says so
    if not any("default_device(" in source or 'print("device: CPU' in source for _, source, _ in cells):
        found.append("no dpnotebook.default_device(): the notebook should say which device it runs on")
    return found


@pytest.mark.parametrize("notebook", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_follows_the_conventions(notebook: Path) -> None:
    assert _violations(notebook) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    cells = [{"cell_type": "code", "metadata": {}, "source": "# NBVAL_IGNORE_OUTPUT\nassert 1 + 1 == 2\n"}]
    path = tmp_path / "99_demo.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert len(_violations(path)) == 3
