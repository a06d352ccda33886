"""The exercise mechanism: verdicts of ``dpnotebook.exercises.check`` and the student/solution sets."""

import json
from pathlib import Path

import pytest

from dpnotebook.exercises import ExerciseFailed, Status, check, judge, register_check, require
from dpnotebook.exercises.__main__ import main
from dpnotebook.exercises._core import ENVIRONMENT_VARIABLE, unregister_check
from dpnotebook.exercises._notebooks import parse_solutions, problems, solved


@pytest.fixture
def square_check():
    @register_check("99.square", todo="write square(x)")
    def _check(square):
        if square(3) == 6:
            raise ExerciseFailed("square(3) gave 6: that is 2 * x, use x * x")
        require(square(3) == 9, f"square(3) should be 9, got {square(3)}")
        return "square(3) == 9"

    yield "99.square"
    unregister_check("99.square")


def _stub(x):
    raise NotImplementedError("your code here")


def test_verdicts(square_check, capsys) -> None:
    assert judge(square_check, _stub).status is Status.NOT_YET
    assert judge(square_check, None).status is Status.NOT_YET
    assert judge(square_check, ...).status is Status.NOT_YET
    wrong = judge(square_check, lambda x: 2 * x)
    assert (wrong.status, wrong.hint) == (Status.WRONG, "square(3) gave 6: that is 2 * x, use x * x")
    assert judge(square_check, lambda x: x + 1).hint == "square(3) should be 9, got 4"
    assert judge(square_check, lambda x: x * x).solved
    verdict = check(square_check, lambda x: 1 / 0)
    assert verdict.status is Status.WRONG and "ZeroDivisionError" in verdict.hint
    assert capsys.readouterr().out == f"✗ 99.square: not right yet — {verdict.hint}\n"


def test_stub_called_deep_inside_is_not_yet(square_check) -> None:
    def wraps_stub(x):
        try:
            return _stub(x)
        except NotImplementedError as err:
            raise RuntimeError("sampler failed") from err

    verdict = judge(square_check, wraps_stub)
    assert (verdict.status, verdict.hint) == (Status.NOT_YET, "write square(x)")


def test_solutions_mode_raises_unless_solved(square_check, monkeypatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "solutions")
    assert check(square_check, lambda x: x * x).solved
    for answer in (_stub, lambda x: 2 * x):
        with pytest.raises(AssertionError, match="99.square"):
            check(square_check, answer)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "")
    assert check(square_check, _stub).status is Status.NOT_YET


def test_bad_ids_are_the_authors_error() -> None:
    with pytest.raises(ValueError, match="exercise_id='linear'"):
        register_check("linear")
    with pytest.raises(ValueError, match="no registered checker"):
        check("98.nothing_here", 1)


def test_a_lettered_tutorial_has_its_own_ids(tmp_path: Path) -> None:
    """'03b' sorts between 03 and 04: its ids, check calls and notebook name carry the letter."""
    from dpnotebook.exercises._core import tutorial_prefix
    from dpnotebook.exercises._notebooks import check_cells

    assert tutorial_prefix("03b.rr_epsilon") == "03b" and tutorial_prefix("03.clipping_bound") == "03"
    for bad in ("03B.x", "03bb.x", "3b.x"):
        with pytest.raises(ValueError, match="not an exercise id"):
            register_check(bad)
    with pytest.raises(ValueError, match="tutorial_98z.py"):
        check("98z.nothing_here", 1)
    notebook = {"cells": [{"cell_type": "code", "source": 'check("03b.rr_epsilon", rr_epsilon)'}]}
    assert check_cells(notebook) == {"03b.rr_epsilon": [0]}
    path = _notebook(tmp_path, "✗ 99.square: not yet solved — write square(x)\n", "def square(x):\n    return x")
    assert problems(path) == []
    lettered = path.with_name("99b_demo.ipynb")
    path.rename(lettered)
    (tmp_path / "solutions" / "99_demo.py").rename(tmp_path / "solutions" / "99b_demo.py")
    assert any("does not start with the notebook's number" in p for p in problems(lettered))


def test_parse_solutions_stops_at_other_cells_and_refuses_duplicates() -> None:
    text = "header\n# %% exercise 99.a\nx = 1\n\n# %%\nignored\n# %% exercise 99.b\ny = 2\n"
    assert parse_solutions(text) == {"99.a": "x = 1", "99.b": "y = 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_solutions("# %% exercise 99.a\n# %% exercise 99.a\n")


def _notebook(folder: Path, stored_output: str, solution: str | None) -> Path:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "Write square."},
        {
            "cell_type": "code",
            "metadata": {"tags": ["exercise"], "exercise_id": "99.square"},
            "execution_count": 1,
            "outputs": [],
            "source": "def square(x):\n    raise NotImplementedError('your code here')\n",
        },
        {
            "cell_type": "code",
            "metadata": {},
            "execution_count": 2,
            "source": 'verdict = check("99.square", square)',
            "outputs": [{"output_type": "stream", "name": "stdout", "text": stored_output}],
        },
    ]
    (folder / "tutorials").mkdir(exist_ok=True)
    path = folder / "tutorials" / "99_demo.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    if solution is not None:  # the solutions folder sits beside tutorials/, outside the student set
        (folder / "solutions").mkdir(exist_ok=True)
        (folder / "solutions" / "99_demo.py").write_text(f"# %% exercise 99.square\n{solution}\n")
    return path


def test_student_set_problems(tmp_path: Path) -> None:
    good = _notebook(tmp_path, "✗ 99.square: not yet solved — write square(x)\n", "def square(x):\n    return x * x")
    assert problems(good) == []
    solved_cells = solved(good)["cells"]
    assert solved_cells[1]["source"] == "def square(x):\n    return x * x\n" and solved_cells[2]["outputs"] == []
    passing_stub = _notebook(tmp_path, "✓ 99.square: solved\n", "def square(x):\n    return x * x")
    assert any("does not say 'not yet solved'" in p for p in problems(passing_stub))
    (tmp_path / "solutions" / "99_demo.py").write_text("# %% exercise 99.other\npass\n")
    found = problems(passing_stub)
    assert any("has no block" in p for p in found) and any("has no cell tagged" in p for p in found)


def test_commands(tmp_path: Path, capsys) -> None:
    _notebook(tmp_path, "✗ 99.square: not yet solved — write square(x)\n", "def square(x):\n    return x * x")
    tutorials = tmp_path / "tutorials"
    main(["solve", str(tutorials), str(tmp_path / "solved")])
    assert "return x * x" in (tmp_path / "solved" / "99_demo.ipynb").read_text()
    main(["student", str(tutorials), str(tmp_path / "student")])
    assert "NotImplementedError" in (tmp_path / "student" / "99_demo.ipynb").read_text()
    (tmp_path / "solutions" / "99_demo.py").write_text("nothing\n")
    with pytest.raises(SystemExit):
        main(["student", str(tutorials)])
    assert "has no block" in capsys.readouterr().err


def test_solutions_folder_can_be_named(tmp_path: Path) -> None:
    _notebook(tmp_path, "✗ 99.square: not yet solved — write square(x)\n", "def square(x):\n    return x * x")
    (tmp_path / "solutions").rename(tmp_path / "elsewhere")
    tutorials = tmp_path / "tutorials"
    with pytest.raises(SystemExit):  # not beside tutorials/ any more
        main(["solve", str(tutorials), str(tmp_path / "solved")])
    main(["solve", str(tutorials), str(tmp_path / "solved"), "--solutions", str(tmp_path / "elsewhere")])
    assert "return x * x" in (tmp_path / "solved" / "99_demo.ipynb").read_text()


def test_student_clear_outputs(tmp_path: Path, capsys) -> None:
    stored = "✗ 99.square: not yet solved — write square(x)\n"
    _notebook(tmp_path, stored, "def square(x):\n    return x * x")
    tutorials = tmp_path / "tutorials"
    main(["student", str(tutorials), str(tmp_path / "plain")])
    plain = json.loads((tmp_path / "plain" / "99_demo.ipynb").read_text())
    assert plain["cells"][2]["outputs"][0]["text"] == stored  # a plain copy keeps the outputs
    main(["student", str(tutorials), str(tmp_path / "cleared"), "--clear-outputs"])
    assert "without outputs" in capsys.readouterr().out
    cleared = json.loads((tmp_path / "cleared" / "99_demo.ipynb").read_text())
    code = [c for c in cleared["cells"] if c["cell_type"] == "code"]
    assert [c["outputs"] for c in code] == [[], []] and [c["execution_count"] for c in code] == [None, None]
    assert "NotImplementedError" in code[0]["source"]  # still the student's stub
    committed = json.loads((tutorials / "99_demo.ipynb").read_text())
    assert committed["cells"][2]["outputs"][0]["text"] == stored  # the committed notebook is left as it was
    with pytest.raises(SystemExit):  # nowhere to write the cleared copy
        main(["student", str(tutorials), "--clear-outputs"])
    assert "needs OUT_DIR" in capsys.readouterr().err


def test_partly_done_answer_is_not_yet(monkeypatch) -> None:
    from dpnotebook.exercises import NotYetSolved

    @register_check("99.two_parts")
    def _check(first, second):
        require(first == 1, "first is 1")
        if second is ...:
            raise NotYetSolved("first part right; now the second")

    try:
        verdict = judge("99.two_parts", 1, second=...)
        assert (verdict.status, verdict.hint) == (Status.NOT_YET, "first part right; now the second")
        assert judge("99.two_parts", 2, second=...).status is Status.WRONG
    finally:
        unregister_check("99.two_parts")
