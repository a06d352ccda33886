"""The README's Python snippets run as they are, each in a fresh interpreter.

A snippet a reader copies must not fail with a ``NameError``; the one that cannot run on
its own (it needs ``torchrun``) is listed in :data:`FRAGMENTS` with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: sections whose snippet is a fragment by design, and why
FRAGMENTS = {"On several processes or machines": "it needs torchrun and an initialised process group"}


def snippets() -> dict[str, str]:
    """``{section heading: its Python code block}`` for every ```python block in README.md."""
    found: dict[str, str] = {}
    heading = ""
    for block in re.split(r"^(#+ .*)$", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.M):
        if block.startswith("#"):
            heading = block.lstrip("#").strip()
            continue
        for code in re.findall(r"```python\n(.*?)```", block, flags=re.S):
            assert heading not in found, f"two Python snippets under {heading!r}: give each its own section"
            found[heading] = code
    return found


def test_the_readme_snippets_are_known() -> None:
    assert set(FRAGMENTS) <= set(snippets())
    assert {"Per-sample gradients in five lines", "Write your own grad sampler", "Train privately"} <= set(snippets())


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
