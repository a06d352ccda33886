"""docs/course-guide.md stays true of the tutorials: every notebook has its row with its exercise ids and
its measured figures, the 90-minute lab fills exactly 90 minutes, and every lesson fits in its 90."""

import itertools
import re
from pathlib import Path

import pytest

from dpnotebook.exercises import exercise_cells, read_notebook

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "course-guide.md").read_text(encoding="utf-8")
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def _section(title: str) -> str:
    start = GUIDE.index(f"## {title}")
    following = GUIDE.find("\n## ", start + 1)
    return GUIDE[start : following if following != -1 else len(GUIDE)]


def _rows(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]  # without the header


def _number(stem: str) -> str:
    return stem.split("_", 1)[0]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_tutorial_has_its_goals_row_with_its_exercises(notebook: Path) -> None:
    rows = {row[0].split(" ", 1)[0]: row for row in _rows(_section("Learning goals and timing"))}
    number = _number(notebook.stem)
    assert number in rows, f"docs/course-guide.md has no row for tutorial {number} in 'Learning goals and timing'"
    listed = set(re.findall(r"`(\d\d[a-z]?\.[A-Za-z0-9_.]+)`", rows[number][2]))
    assert listed == set(exercise_cells(read_notebook(notebook))), (
        f"the guide lists {sorted(listed)} for tutorial {number}; the notebook's exercises are "
        f"{sorted(exercise_cells(read_notebook(notebook)))}"
    )
    assert re.match(r"\d+ \(\d+\)", rows[number][4]), f"tutorial {number}: minutes as 'full (quick)'"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_tutorial_has_its_measured_run_time_and_memory(notebook: Path) -> None:
    rows = {row[0]: row for row in _rows(_section("Running the course"))}
    number = _number(notebook.stem)
    assert number in rows, f"docs/course-guide.md's table of run time and memory has no row for {number}"
    seconds, megabytes = float(rows[number][1]), float(rows[number][4])
    assert seconds > 0 and 0 < megabytes <= 1536, f"tutorial {number}: {seconds} s, {megabytes} MB (budget 1.5 GB)"


def test_the_lab_fills_ninety_minutes_in_order() -> None:
    slots = [row[0] for row in _rows(_section("A 90-minute lab"))]
    bounds = [tuple(int(x) for x in re.split("[–-]", slot)) for slot in slots]
    assert bounds[0][0] == 0 and bounds[-1][1] == 90, slots
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), f"the lab's slots leave gaps or overlap: {slots}"
    covered = " ".join(row[1] for row in _rows(_section("A 90-minute lab")))
    assert "03b" in covered, "the lab must define DP and show an attack: 03b belongs in it (issue #29)"


def test_every_lesson_fits_its_ninety_minutes_and_every_tutorial_has_a_lesson() -> None:
    rows = _rows(_section("Four lessons"))
    placed = set()
    for row in rows:
        notebooks = row[2]
        minutes = [int(m) for m in re.findall(r"\b\d\d[a-z]? \((\d+)", notebooks)]
        minutes += [int(m) for m in re.findall(r"(\d+) to wrap up", notebooks)]
        assert int(row[1]) == 90 and 0 < sum(minutes) <= 90, f"lesson {row[0]}: {sum(minutes)} minutes in 90"
        named = re.sub(r"\([^)]*\)|\d+ to wrap up", "", notebooks)  # drop the minutes, keep the notebooks
        placed.update(re.findall(r"\b(\d\d[a-z]?)\b", named))
    missing = {_number(nb.stem) for nb in NOTEBOOKS} - placed
    assert not missing, f"tutorials in no lesson (not even as homework): {sorted(missing)}"
