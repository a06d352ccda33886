"""What the quick loop (``make test-fast``: ``pytest -m "not slow"``) leaves out by where a test lives.

The root ``conftest.py`` marks every item :func:`is_slow` names with ``slow``; ``tests/test_quick_loop.py``
checks the outcome. A slow test anywhere else carries ``@pytest.mark.slow`` itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Folders (relative to the repository root) whose every test is slow, and why.
SLOW_FOLDERS: dict[str, str] = {
    "tests/browser": "a real browser (Playwright) renders the tutorials",
    "tests/distributed": "each launch starts processes (run_on_ranks)",
    "tests/zoo": "every real architecture, mode and K against the float64 oracle (about 75 s on 2 cores)",
}


def is_slow(item: pytest.Item, root: Path) -> bool:
    """Whether ``item`` is slow by where it lives: a tutorial's cell under nbval, or a test in a slow folder.

    Args:
        item: A collected test.
        root: The repository root (``config.rootpath``).

    Returns:
        True for an item of a notebook (``*.ipynb``) or of a module inside one of :data:`SLOW_FOLDERS`.
    """
    path = Path(item.path)
    if path.suffix == ".ipynb":
        return True
    try:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:  # a test outside the repository
        return False
    return any(relative.startswith(folder + "/") for folder in SLOW_FOLDERS)
