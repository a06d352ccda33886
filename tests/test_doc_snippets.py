"""The README's Python snippets run as they are, each in a fresh interpreter; the docs' fragments import what they use.

A snippet a reader copies must not fail with a ``NameError``; the one that cannot run on
its own (it needs ``torchrun``) is listed in :data:`FRAGMENTS` with the reason. The fragment
in ``docs/distributed.md`` cannot run either, but every name it uses is imported or is one
of the placeholders its comment names.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: sections whose snippet is a fragment by design, and why
FRAGMENTS = {"On several processes or machines": "it needs torchrun and an initialised process group"}


def snippets(page: str = "README.md") -> dict[str, str]:
    """``{section heading: its Python code block}`` for every ```python block in ``page``."""
    found: dict[str, str] = {}
    heading, code, other = "", None, False
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines(keepends=True):
        if other:  # inside another language's block: its "#" lines are not headings
            other = not line.startswith("```")
        elif code is not None:  # inside a ```python block
            if line.startswith("```"):
                assert heading not in found, f"two Python snippets under {heading!r}: give each its own section"
                found[heading], code = "".join(code), None
            else:
                code.append(line)
        elif line.startswith("```python"):
            code = []
        elif line.startswith("```"):
            other = True
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    return found


def test_the_readme_snippets_are_known() -> None:
    assert set(FRAGMENTS) <= set(snippets())
    assert {"Per-sample gradients in five lines", "Write your own grad sampler", "Train privately"} <= set(snippets())


@pytest.mark.slow  # each snippet in a fresh interpreter; 'Train privately' trains
@pytest.mark.parametrize("heading", [h for h in snippets() if h not in FRAGMENTS])
def test_a_readme_snippet_runs_as_it_is(heading: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", snippets()[heading]], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, f"README section {heading!r} fails:\n{done.stderr[-3000:]}"
    if heading == "Train privately":
        accuracy, epsilon = re.search(r"test accuracy (\d+)%, epsilon ([\d.]+)", done.stdout).groups()
        assert int(accuracy) > 50 and float(epsilon) <= 8.0, done.stdout


def unbound_names(code: str) -> set[str]:
    """Names ``code`` reads but never imports, assigns or defines (builtins aside)."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):  # a function's or a lambda's parameter
            bound.add(node.arg)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_unbound_names_finds_a_missing_import() -> None:
    assert unbound_names("x = datetime.timedelta(1)\nimport torch\ntorch.ones(1)") == {"datetime"}
    assert unbound_names("f = lambda i: x[i]") == {"x"}


def test_the_distributed_fragment_imports_what_it_uses() -> None:
    (code,) = snippets("docs/distributed.md").values()
    assert unbound_names(code) <= {"train"}, "model, optimizer and train are the placeholders its comment names"
    assert "# model, optimizer and train" in code


#: reference pages whose Python blocks are either whole scripts or fragments that say which names are the reader's
REFERENCE_PAGES = [
    "docs/getting-started.md",
    "docs/guarantees.md",
    "docs/real-models.md",
    "docs/concepts/modes.md",
    "docs/concepts/per-sample-gradients.md",
    "docs/concepts/augmentation-multiplicity.md",
]


@pytest.mark.parametrize("page", REFERENCE_PAGES)
def test_a_reference_fragment_imports_what_it_uses_or_names_it_as_yours(page: str) -> None:
    for heading, code in snippets(page).items():
        yours = " ".join(line for line in code.splitlines() if line.lstrip().startswith("#") and "yours" in line)
        missing = sorted(n for n in unbound_names(code) if not re.search(rf"\b{n}\b", yours))
        assert not missing, f"{page}, {heading!r}: {missing} neither imported nor named in a '# ... yours' comment"


def test_every_table_row_of_the_docs_is_in_a_table() -> None:
    """A blank line inside a Markdown table ends it: the rows after it render as text starting with '|'."""
    stray = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines[1:-1], start=1):
            header = re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip())
            if line.startswith("|") and not lines[i - 1].strip() and not header:
                stray.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not stray, f"table rows after a blank line, outside any table: {stray}"
