"""Every public name has a runnable example (``>>>``) in its docstring or in its module's.

The examples are the doctests that ``make test`` runs (``--doctest-modules``) and the
first thing a reader of the API reference sees, so a public function or class without
one is a gap in both. "Its module" is the module that defines it (``obj.__module__``);
for a constant, the most specific public module that lists it in ``__all__``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

#: The public namespaces: each module's ``__all__`` is checked.
NAMESPACES = [
    "dpnotebook",
    "dpnotebook.privacy",
    "dpnotebook.widgets",
    "dpnotebook.layers",
    "dpnotebook.testing",
    "dpnotebook.validation",
    "dpnotebook.modes",
    "dpnotebook.compare",
    "dpnotebook.grad_sample",
    "dpnotebook.grad_sample._registry",
    "dpnotebook.capabilities",
    "dpnotebook.fixers",
]


def _own_doc(obj: Any) -> str:
    """The object's own docstring: not inherited, and not the docstring of a value's type."""
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__") or ""
    if inspect.isroutine(obj):
        return getattr(obj, "__doc__", None) or ""
    return ""


def public_objects() -> list[tuple[Any, str, list[str]]]:
    """``(object, module whose docstring also counts, its public names)`` for each public object."""
    found: dict[int, tuple[Any, list[str], list[str]]] = {}
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            obj = getattr(module, name)
            entry = found.setdefault(id(obj), (obj, [], []))
            entry[1].append(namespace)
            entry[2].append(f"{namespace}.{name}")
    result = []
    for obj, namespaces, names in found.values():
        if inspect.isclass(obj) or inspect.isroutine(obj):
            home = obj.__module__
        else:
            home = max(namespaces, key=lambda m: m.count("."))
        result.append((obj, home, names))
    return result


def missing_examples() -> list[str]:
    """One line per public object without an example: where it is defined, then its public names."""
    missing = []
    for obj, home, names in public_objects():
        module_doc = importlib.import_module(home).__doc__ or ""
        if ">>>" not in _own_doc(obj) and ">>>" not in module_doc:
            short = names[0].rsplit(".", 1)[1]
            missing.append(f"{home}.{short}  (public as {', '.join(names)})")
    return sorted(missing)


def test_every_public_name_has_an_example() -> None:
    missing = missing_examples()
    assert not missing, (
        f"{len(missing)} public name(s) have no '>>>' example in their docstring or their "
        "module's docstring:\n  " + "\n  ".join(missing)
    )
