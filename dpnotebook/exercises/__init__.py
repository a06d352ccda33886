"""Tutorial exercises: a stub the student completes, and a check that says solved, not yet, or what is wrong.

>>> from dpnotebook.exercises import check, register_check, require, ExerciseFailed, Verdict
>>> Verdict("02.x", Status.SOLVED).solved
True

Checkers live in ``dpnotebook.exercises.tutorial_NN`` (one module per tutorial) and are
imported the first time :func:`check` meets an id starting with ``NN``. The lecturer's
commands: ``python -m dpnotebook.exercises solve tutorials/ OUT_DIR`` (the solution set, from
``solutions/`` beside ``tutorials/``) and ``python -m dpnotebook.exercises student tutorials/
[OUT_DIR] [--clear-outputs]`` (validate, and copy, the student set; without outputs with
``--clear-outputs``).
"""

from dpnotebook.exercises.core import (
    ExerciseFailed,
    NotYetSolved,
    Status,
    Verdict,
    check,
    is_stub,
    judge,
    register_check,
    require,
)

__all__ = [
    "check",
    "judge",
    "register_check",
    "require",
    "is_stub",
    "ExerciseFailed",
    "NotYetSolved",
    "Status",
    "Verdict",
]
