"""The student set and the solution set of the tutorials: tagged stub cells and solution blocks.

An exercise is a code cell tagged ``exercise`` whose metadata holds its ``exercise_id``; its source
is the stub, and a later cell calls ``dpnotebook.exercises.check("<id>", ...)``. The committed
notebooks are the **student set**. The solutions live in ``solutions/<notebook stem>.py`` beside
``tutorials/`` (out of the students' way on Binder), one block per exercise after a line
``# %% exercise <id>``; a block replaces its cell's source in the **solution set**.

>>> text = '''# Solutions to 99_demo
... # %% exercise 99.first
... def first():
...     return 1
...
... # %% exercise 99.second
... second = 2
... '''
>>> parse_solutions(text)
{'99.first': 'def first():\\n    return 1', '99.second': 'second = 2'}
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from dpnotebook.exercises._core import ENVIRONMENT_VARIABLE, Status, tutorial_prefix

TAG = "exercise"
_BLOCK = re.compile(r"^# %% exercise\s+(\S+)\s*$")
_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d[a-z]?\.[A-Za-z0-9_.]+)["']""")


def parse_solutions(text: str) -> dict[str, str]:
    """Split a solutions file into ``{exercise_id: source}``; text before the first block is ignored.

    Raises ``ValueError`` when an id appears twice.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _BLOCK.match(line)
        if match:
            if match.group(1) in blocks:
                raise ValueError(f"solution block {match.group(1)!r} appears twice. Fix: keep one.")
            current = blocks[match.group(1)] = []
        elif line.startswith("# %%"):
            current = None
        elif current is not None:
            current.append(line)
    return {key: "\n".join(lines).strip("\n") for key, lines in blocks.items()}


def solutions_path(notebook: Path, solutions_dir: Path | None = None) -> Path:
    """Where ``notebook``'s solutions live: ``<solutions_dir>/<stem>.py``, by default in ``solutions/`` beside
    the notebook's folder.

    >>> solutions_path(Path("tutorials/02_x.ipynb")).as_posix()
    'solutions/02_x.py'
    """
    folder = Path(notebook).parent.parent / "solutions" if solutions_dir is None else Path(solutions_dir)
    return folder / f"{Path(notebook).stem}.py"


def _blocks(notebook: Path, solutions_dir: Path | None) -> tuple[Path, dict[str, str]]:
    path = solutions_path(notebook, solutions_dir)
    return path, parse_solutions(path.read_text(encoding="utf-8")) if path.exists() else {}


def read_notebook(path: Path) -> dict[str, Any]:
    """The notebook's JSON."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_notebook(notebook: dict[str, Any], path: Path) -> None:
    """Write ``notebook`` the way Jupyter does (one-space indent, UTF-8, final newline)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def exercise_cells(notebook: dict[str, Any]) -> dict[str, int]:
    """``{exercise_id: cell index}`` of the code cells tagged ``exercise``.

    Raises ``ValueError`` when a tagged cell has no ``exercise_id`` or repeats one.
    """
    found: dict[str, int] = {}
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code" or TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        exercise_id = cell["metadata"].get("exercise_id")
        if not exercise_id or exercise_id in found:
            raise ValueError(
                f"cell {index} is tagged {TAG!r} with exercise_id={exercise_id!r}: each exercise cell needs "
                "its own metadata 'exercise_id', e.g. '02.linear_einsum'."
            )
        found[exercise_id] = index
    return found


def check_cells(notebook: dict[str, Any]) -> dict[str, list[int]]:
    """``{exercise_id: [cell indices]}`` of the code cells calling ``check("<id>", ...)``."""
    found: dict[str, list[int]] = {}
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            for exercise_id in _CHECK_CALL.findall(_text(cell.get("source", ""))):
                found.setdefault(exercise_id, []).append(index)
    return found


def problems(notebook_path: Path, solutions_dir: Path | None = None) -> list[str]:
    """Everything wrong with a student notebook and its solutions file; empty when all is well.

    Checked: every tagged cell has a solution block and every block a tagged cell; ids start with the
    notebook's number; each exercise has a check cell after it whose stored output says "not yet
    solved"; a solution differs from its stub. ``solutions_dir`` is passed to :func:`solutions_path`.
    """
    name = Path(notebook_path).name
    notebook = read_notebook(notebook_path)
    try:
        cells = exercise_cells(notebook)
    except ValueError as err:
        return [f"{name}: {err}"]
    path, blocks = _blocks(notebook_path, solutions_dir)
    found = [
        f"{name}: exercise {i!r} has no block '# %% exercise {i}' in {path}" for i in sorted(set(cells) - set(blocks))
    ]
    found += [f"{path}: block {i!r} has no cell tagged {TAG!r} in {name}" for i in sorted(set(blocks) - set(cells))]
    checks = check_cells(notebook)
    for exercise_id, index in cells.items():
        if not name.startswith(tutorial_prefix(exercise_id) + "_"):
            found.append(f"{name}: exercise id {exercise_id!r} does not start with the notebook's number")
        later = [i for i in checks.get(exercise_id, []) if i > index]
        if not later:
            found.append(f"{name}: exercise {exercise_id!r} (cell {index}) has no check cell after it")
        for i in later:
            outputs = notebook["cells"][i].get("outputs", [])
            text = "".join(_text(o.get("text", o.get("data", {}).get("text/plain", ""))) for o in outputs)
            if Status.NOT_YET.value not in text:
                found.append(
                    f"{name}: the stored output of cell {i}, checking {exercise_id!r}, does not say "
                    f"{Status.NOT_YET.value!r}: the committed notebook must hold the unsolved stub, executed"
                )
        if exercise_id in blocks and blocks[exercise_id].strip() == _text(notebook["cells"][index]["source"]).strip():
            found.append(f"{path}: the solution of {exercise_id!r} is the stub itself")
    return found


def solved(notebook_path: Path, solutions_dir: Path | None = None) -> dict[str, Any]:
    """The notebook with every tagged cell's source replaced by its solution, all outputs cleared.

    Raises ``ValueError`` when the notebook and its solutions file do not match (see :func:`problems`).
    """
    notebook = read_notebook(notebook_path)
    cells = exercise_cells(notebook)
    if not cells:
        return notebook
    path, blocks = _blocks(notebook_path, solutions_dir)
    if set(cells) != set(blocks):
        raise ValueError(
            f"{notebook_path}: exercises {sorted(cells)} but solution blocks {sorted(blocks)} in {path}. "
            "Fix: one '# %% exercise <id>' block per tagged cell."
        )
    for exercise_id, index in cells.items():
        notebook["cells"][index]["source"] = blocks[exercise_id] + "\n"
    return without_outputs(notebook)


def without_outputs(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``notebook`` without outputs, execution counts and stored widget state.

    >>> cell = {"cell_type": "code", "source": "1", "outputs": [{"text": "1"}], "execution_count": 3, "metadata": {}}
    >>> nb = {"cells": [cell], "metadata": {"widgets": {"state": {}}}}
    >>> cleared = without_outputs(nb)
    >>> cleared["cells"][0]["outputs"], cleared["cells"][0]["execution_count"], "widgets" in cleared["metadata"]
    ([], None, False)
    >>> nb["cells"][0]["outputs"]  # the original is untouched
    [{'text': '1'}]
    """
    notebook = copy.deepcopy(notebook)
    notebook.get("metadata", {}).pop("widgets", None)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return notebook


def execute(notebook: dict[str, Any], cwd: Path, timeout: int = 600) -> dict[str, Any]:
    """Run ``notebook`` in a fresh kernel with ``DPNOTEBOOK_EXERCISES=solutions``; returns it executed.

    Needs ``nbclient``; a check that is not solved raises ``CellExecutionError``.
    """
    from nbclient import NotebookClient
    from nbformat import reads

    previous = os.environ.get(ENVIRONMENT_VARIABLE)
    os.environ[ENVIRONMENT_VARIABLE] = "solutions"
    try:
        node = reads(json.dumps(notebook), as_version=4)
        NotebookClient(
            node, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        ).execute()
    finally:
        if previous is None:
            del os.environ[ENVIRONMENT_VARIABLE]
        else:
            os.environ[ENVIRONMENT_VARIABLE] = previous
    return json.loads(json.dumps(node))  # nbformat joins each source and text into one string
