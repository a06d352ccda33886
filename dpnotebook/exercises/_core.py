"""Checking a tutorial exercise: the registry of checkers and the verdict a student sees.

A checker is registered under an id such as ``"02.linear_einsum"`` (the tutorial's number, with a
letter for one slotted between two others as ``"03b"``, a dot, a name). It receives the answer and
the notebook's context and returns (solved, optionally with a sentence) or raises
:class:`ExerciseFailed` with a hint naming the mistake. :func:`check` prints one line: *solved*,
*not yet solved* (the answer is still the stub: ``None``, ``...`` or a function raising
``NotImplementedError``) or *not right yet*. It never raises in a student's notebook; with
``DPNOTEBOOK_EXERCISES=solutions`` (the tests of the solved notebooks) anything but *solved*
raises ``AssertionError``.

>>> @register_check("99.double", todo="write double(x) returning 2 * x")
... def _check_double(double):
...     if double(3) == 3 + 3 + 3:
...         raise ExerciseFailed("that is 3 * x: multiply by 2, not 3")
...     require(double(3) == 6, "double(3) should be 6")
...     return "double(3) == 6"
>>> def stub(x):
...     raise NotImplementedError("your code here")
>>> check("99.double", stub).status
✗ 99.double: not yet solved — write double(x) returning 2 * x
<Status.NOT_YET: 'not yet solved'>
>>> check("99.double", lambda x: 3 * x).hint
✗ 99.double: not right yet — that is 3 * x: multiply by 2, not 3
'that is 3 * x: multiply by 2, not 3'
>>> check("99.double", lambda x: 2 * x).solved
✓ 99.double: solved — double(3) == 6
True
>>> _ = unregister_check("99.double")
"""

from __future__ import annotations

import enum
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

ENVIRONMENT_VARIABLE = "DPNOTEBOOK_EXERCISES"
"""Set to ``"solutions"`` to make every verdict but *solved* raise ``AssertionError``."""

_ID = re.compile(r"^(\d\d[a-z]?)\.[A-Za-z_][A-Za-z0-9_.]*$")
_DEFAULT_TODO = "replace the stub in the exercise cell with your answer, run that cell, then this one"


class Status(enum.Enum):
    """The three outcomes of a check; the value is the phrase the student reads."""

    SOLVED = "solved"
    NOT_YET = "not yet solved"
    WRONG = "not right yet"


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` decided: the exercise, its :class:`Status`, and the hint (or what was achieved)."""

    exercise_id: str
    status: Status
    hint: str = ""

    @property
    def solved(self) -> bool:
        """Whether the answer passed its check."""
        return self.status is Status.SOLVED

    def line(self) -> str:
        """The one line :func:`check` prints, e.g. ``✗ 02.x: not yet solved — fill in the sampler``."""
        mark = "✓" if self.solved else "✗"
        return f"{mark} {self.exercise_id}: {self.status.value}" + (f" — {self.hint}" if self.hint else "")


class ExerciseFailed(Exception):
    """Raised by a checker when the answer is wrong; its message is the hint shown to the student."""

    def __init__(self, hint: str) -> None:
        super().__init__(hint)
        self.hint = hint


class NotYetSolved(ExerciseFailed):
    """Raised by a checker when part of the answer is still a stub; its message says what is left to do."""


_CHECKS: dict[str, tuple[Callable[..., Any], str]] = {}  # id: (checker, todo)


def tutorial_prefix(exercise_id: str) -> str:
    """The tutorial an exercise belongs to: the part of its id before the dot.

    >>> tutorial_prefix("02.linear_einsum"), tutorial_prefix("03b.rr_epsilon")
    ('02', '03b')
    """
    if not isinstance(exercise_id, str) or not _ID.match(exercise_id):
        raise ValueError(
            f"exercise_id={exercise_id!r} is not an exercise id. Fix: use the tutorial's two-digit number "
            "(and its letter, if it has one), a dot and a name, e.g. '02.linear_einsum' or '03b.rr_epsilon'."
        )
    return exercise_id.split(".", 1)[0]


def register_check(exercise_id: str, todo: str = _DEFAULT_TODO) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a checker for ``exercise_id``, with ``todo``: what to do while the answer is the stub.

    :func:`check` imports ``dpnotebook.exercises._tutorial_NN`` the first time it meets an id ``"NN.name"``.
    """
    tutorial_prefix(exercise_id)

    def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
        _CHECKS[exercise_id] = (function, todo)
        return function

    return decorator


def unregister_check(exercise_id: str) -> Callable[..., Any]:
    """Remove a checker (tests and doctests use it); returns the function removed."""
    return _CHECKS.pop(exercise_id)[0]


def require(condition: bool, hint: str) -> None:
    """Raise :class:`ExerciseFailed` with ``hint`` unless ``condition`` holds.

    >>> require(False, "off by one")
    Traceback (most recent call last):
    ...
    dpnotebook.exercises._core.ExerciseFailed: off by one
    """
    if not condition:
        raise ExerciseFailed(hint)


def is_stub(value: Any) -> bool:
    """Whether ``value`` is a placeholder left for the student: ``None`` or ``...``.

    >>> is_stub(...), is_stub(None), is_stub(0.0)
    (True, True, False)
    """
    return value is None or value is Ellipsis


def pending(value: Any, hint: str) -> None:
    """Raise :class:`NotYetSolved` with ``hint`` while ``value`` (one part of a multi-part answer) is a stub."""
    if is_stub(value):
        raise NotYetSolved(hint)


def number(value: Any, hint: str, *, finite: bool = False) -> float:
    """``value`` as a float if it is a real number (not a bool or NaN; not inf if ``finite``), else
    :class:`ExerciseFailed` with ``hint``.

    >>> number("2", "return one number")
    Traceback (most recent call last):
    ...
    dpnotebook.exercises._core.ExerciseFailed: return one number
    """
    real = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    require(real and (not finite or math.isfinite(value)), hint)
    return float(value)


def close(a: float, b: float, rel: float = 1e-6, abs_tol: float = 1e-12) -> bool:
    """``math.isclose`` with the checkers' default tolerances."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def spot_slip(
    got: float, slips: Iterable[tuple[float, str]], right: float, *, rel: float = 1e-6, prefix: str = ""
) -> None:
    """Raise :class:`ExerciseFailed` with the hint of the first slip whose value ``got`` equals (``right`` does not).

    >>> spot_slip(4.0, [(4.0, "squared: take the root")], right=2.0, prefix="norm = 4: ")
    Traceback (most recent call last):
    ...
    dpnotebook.exercises._core.ExerciseFailed: norm = 4: squared: take the root
    """
    for value, hint in slips:
        if close(got, value, rel) and not close(value, right, rel):
            raise ExerciseFailed(prefix + hint)


def _not_implemented(err: BaseException | None) -> bool:
    """Whether ``err``, or an error it was raised from or while handling, is a ``NotImplementedError``."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, NotImplementedError):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def judge(exercise_id: str, answer: Any, **context: Any) -> Verdict:
    """Run the checker and return its :class:`Verdict` without printing or raising.

    >>> @register_check("99.half", todo="write half(x)")
    ... def _half(half):
    ...     require(half(4) == 2, "half(4) should be 2")
    >>> judge("99.half", ...).status, judge("99.half", lambda x: x // 3).hint
    (<Status.NOT_YET: 'not yet solved'>, 'half(4) should be 2')
    >>> judge("99.half", lambda x: x.missing).hint
    "your answer raised AttributeError: 'int' object has no attribute 'missing'"
    >>> _ = unregister_check("99.half")
    """
    module = f"dpnotebook.exercises._tutorial_{tutorial_prefix(exercise_id)}"
    if exercise_id not in _CHECKS:
        try:
            import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    if exercise_id not in _CHECKS:
        raise ValueError(
            f"exercise_id={exercise_id!r} has no registered checker. Fix: define it with "
            f"@register_check({exercise_id!r}) in {module.replace('.', '/')}.py."
        )
    function, todo = _CHECKS[exercise_id]
    if is_stub(answer):
        return Verdict(exercise_id, Status.NOT_YET, todo)
    try:
        message = function(answer, **context)
    except ExerciseFailed as err:
        return Verdict(exercise_id, Status.NOT_YET if isinstance(err, NotYetSolved) else Status.WRONG, err.hint)
    except Exception as err:  # noqa: BLE001 - the student's code raised: show them what, never a traceback
        if _not_implemented(err):
            return Verdict(exercise_id, Status.NOT_YET, todo)
        first_line = (str(err).strip().splitlines() or [""])[0]
        return Verdict(exercise_id, Status.WRONG, f"your answer raised {type(err).__name__}: {first_line}")
    return Verdict(exercise_id, Status.SOLVED, message or "")


def check(exercise_id: str, answer: Any, **context: Any) -> Verdict:
    """Check ``answer`` for ``exercise_id``, print one line saying so, and return the :class:`Verdict`.

    ``answer`` is usually the function the exercise cell defines; ``context`` is anything else the checker
    needs from the notebook (a model, a budget ...).

    Raises:
        ValueError: ``exercise_id`` is malformed or has no checker (the notebook's mistake).
        AssertionError: ``DPNOTEBOOK_EXERCISES=solutions`` and the answer is not solved.

    >>> import os
    >>> @register_check("99.one")
    ... def _one(answer):
    ...     require(answer == 1, "the answer is 1")
    >>> os.environ[ENVIRONMENT_VARIABLE] = "solutions"
    >>> check("99.one", 2)
    Traceback (most recent call last):
    ...
    AssertionError: ✗ 99.one: not right yet — the answer is 1
    >>> del os.environ[ENVIRONMENT_VARIABLE]; _ = unregister_check("99.one")
    """
    verdict = judge(exercise_id, answer, **context)
    print(verdict.line(), flush=True)
    if not verdict.solved and os.environ.get(ENVIRONMENT_VARIABLE, "") == "solutions":
        raise AssertionError(verdict.line())
    return verdict
