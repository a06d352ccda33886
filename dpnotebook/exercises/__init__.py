"""Tutorial exercises: a stub the student completes, and a check that says solved, not yet, or what is wrong.

>>> from dpnotebook.exercises import check, register_check, require, ExerciseFailed, Verdict
>>> Verdict("02.x", Status.SOLVED).solved
True

Checkers live in ``dpnotebook.exercises._tutorial_NN``, one module per tutorial built from the shared
checks (:func:`require`, :func:`number`, :func:`spot_slip`, :func:`pending`). The lecturer's commands
(``python -m dpnotebook.exercises solve|student``) use :func:`solved`, :func:`problems`,
:func:`exercise_cells` and :func:`parse_solutions`.
"""

from dpnotebook.exercises._core import (
    ExerciseFailed,
    NotYetSolved,
    Status,
    Verdict,
    check,
    close,
    is_stub,
    judge,
    number,
    pending,
    register_check,
    require,
    spot_slip,
)
from dpnotebook.exercises._notebooks import (
    exercise_cells,
    parse_solutions,
    problems,
    read_notebook,
    solved,
    write_notebook,
)

__all__ = [
    "check",
    "judge",
    "register_check",
    "require",
    "is_stub",
    "pending",
    "number",
    "close",
    "spot_slip",
    "ExerciseFailed",
    "NotYetSolved",
    "Status",
    "Verdict",
    "read_notebook",
    "write_notebook",
    "exercise_cells",
    "parse_solutions",
    "problems",
    "solved",
]
