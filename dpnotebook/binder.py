"""Launch-on-Binder links, built from ``[project.urls] Repository`` in ``pyproject.toml``; ``make badges``
(``python -m dpnotebook.binder --update README.md tutorials``) rewrites every badge.

>>> binder_url("01_per_sample_gradients.ipynb")
'https://mybinder.org/v2/gh/dpnotebook/dpnotebook/main?labpath=tutorials%2F01_per_sample_gradients.ipynb'
"""

from __future__ import annotations

import argparse
import re
from importlib.metadata import metadata
from pathlib import Path

__all__ = ["repository_url", "binder_url", "badge_markdown", "update_badges"]

BADGE_IMAGE = "https://mybinder.org/badge_logo.svg"
_BADGE = re.compile(r"\[!\[Launch on Binder\]\([^)]*\)\]\([^)]*\)")


def repository_url() -> str:
    """``[project.urls] Repository`` of the installed package."""
    for entry in metadata("dpnotebook").get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip().rstrip("/")
    raise LookupError("pyproject.toml has no [project.urls] Repository entry.")


def binder_url(notebook: str | None = None, *, branch: str = "main") -> str:
    """The mybinder.org link that opens ``tutorials/<notebook>`` (or the folder) in JupyterLab."""
    found = re.match(r"https://github\.com/([^/]+)/([^/]+)$", repository_url())
    if not found:
        raise ValueError(f"Binder links need a GitHub repository URL, got {repository_url()!r}.")
    base = f"https://mybinder.org/v2/gh/{found.group(1)}/{found.group(2)}/{branch}"
    return f"{base}?labpath=tutorials%2F{notebook}" if notebook else f"{base}?urlpath=lab%2Ftree%2Ftutorials"


def badge_markdown(notebook: str | None = None) -> str:
    """``[![Launch on Binder](...)](binder_url(notebook))``."""
    return f"[![Launch on Binder]({BADGE_IMAGE})]({binder_url(notebook)})"


def update_badges(paths: list[Path]) -> list[Path]:
    """Rewrite the badges in Markdown files and notebooks (folders are searched for ``*.ipynb``); returns the
    files that changed."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    changed = []
    for file in files:
        text = file.read_text()
        if file.suffix == ".ipynb":
            import nbformat  # a development tool: nbformat comes with JupyterLab

            nb = nbformat.reads(text, as_version=4)
            for cell in nb.cells:
                if cell.cell_type == "markdown":
                    cell.source = _BADGE.sub(badge_markdown(file.name), cell.source)
            new = nbformat.writes(nb) + "\n"
        else:
            new = _BADGE.sub(badge_markdown(), text)
        if new != text:
            file.write_text(new)
            changed.append(file)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description="Rewrite Launch-on-Binder badges from pyproject.toml.")
    parser.add_argument("--update", nargs="+", type=Path, required=True, metavar="PATH")
    for path in update_badges(parser.parse_args().update):
        print(f"updated {path}")


if __name__ == "__main__":
    main()
