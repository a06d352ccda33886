"""Every tutorial's exercises: the committed (student) notebooks hold stubs whose checks say
"not yet solved", every stub has a solution block, and every solved notebook runs with its
checks passing (``DPNOTEBOOK_EXERCISES=solutions`` turns any other verdict into an error).

Notebooks are discovered from ``tutorials/*.ipynb``, so a new tutorial is covered when it lands.
"""

from pathlib import Path

import pytest

from dpnotebook.exercises._notebooks import exercise_cells, problems, read_notebook, solutions_path, solved

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"  # outside tutorials/, which Binder opens
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
WITH_EXERCISES = [nb for nb in NOTEBOOKS if exercise_cells(read_notebook(nb))]


def test_tutorials_are_found() -> None:
    assert NOTEBOOKS, f"no notebooks in {TUTORIALS}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_student_notebook_matches_its_solutions(notebook: Path) -> None:
    assert problems(notebook) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_tutorial_has_an_exercise(notebook: Path) -> None:
    assert exercise_cells(read_notebook(notebook)), (
        f"{notebook.name} has no code cell tagged 'exercise' (with metadata exercise_id): every tutorial ends with "
        "an exercise the student solves; see docs/course-guide.md"
    )


def test_every_solutions_file_has_its_notebook() -> None:
    stems = {nb.stem for nb in NOTEBOOKS}
    orphans = [p.name for p in sorted(SOLUTIONS.glob("*.py")) if p.stem not in stems]
    assert orphans == [], f"solution files without a notebook of the same name: {orphans}"


@pytest.mark.slow  # executes every solved notebook
@pytest.mark.parametrize("notebook", WITH_EXERCISES, ids=lambda p: p.stem)
def test_solved_notebook_passes_its_checks(notebook: Path, tmp_path: Path) -> None:
    from dpnotebook.exercises._notebooks import execute, write_notebook

    result = solved(notebook)
    write_notebook(result, tmp_path / notebook.name)  # what `python -m dpnotebook.exercises solve` writes
    executed = execute(result, cwd=TUTORIALS)  # raises CellExecutionError when a check fails
    outputs = "".join(
        "".join(o.get("text", "")) for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]
    )
    for exercise_id in exercise_cells(result):
        assert f"✓ {exercise_id}: solved" in outputs, f"{notebook.name}: no check of {exercise_id} printed solved"
    assert solutions_path(notebook) == SOLUTIONS / f"{notebook.stem}.py" and solutions_path(notebook).exists()


def test_no_solutions_in_the_student_folder() -> None:
    leaked = sorted(p.relative_to(TUTORIALS).as_posix() for p in TUTORIALS.rglob("*.py"))
    assert leaked == [], f"solutions belong in {SOLUTIONS}, not beside the notebooks Binder opens: {leaked}"
