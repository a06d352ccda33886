"""Sphinx glue for the dpnotebook docs: generated API pages, the capability table, widgets.

* ``.. dpn-api::`` (no argument) documents, on its page, every public module
  that ``dpn_api_pages`` (conf.py) assigns to that page. A module is public when
  no part of its dotted path starts with ``_`` and it defines ``__all__``; each
  name in an ``__all__`` is documented once, in its *home* module (where it is
  defined, or the most specific public module that lists it), and the other
  modules that re-export it link there.
* ``.. dpn-capabilities::`` runs :func:`dpnotebook.capabilities.capability_table`
  while the docs build and renders it with
  :func:`dpnotebook.capabilities.capability_markdown` (never hand-written).
* ``.. dpn-modes::`` lists the modes registered in :mod:`dpnotebook.modes`.
* References to a public name through any of its import paths
  (``dpnotebook.PrivacyEngine``, ``dpnotebook.privacy.PrivacyEngine``, a short
  name inside a module) resolve to its home; a reference that starts with
  ``dpnotebook.`` and names nothing is a warning, hence an error under ``-W``.
* Notebook widget outputs: a view whose model is in the notebook's stored
  widget state is rendered live (myst-nb adds the widget manager's JavaScript),
  with the output's PNG, if any, shown until the manager has drawn it; a view
  without stored state falls back to the output's other formats, and is a
  warning when nothing but text is left.

Why this and not ``sphinx.ext.autosummary`` (checked against Sphinx 9.0, issue #33): the
rendering *is* Sphinx's own (every entry is an ``autoclass`` / ``autofunction`` / ``autodata``
directive of ``sphinx.ext.autodoc`` with napoleon); only the choice of what goes where is ours,
and autosummary does not make that choice the way this API needs:

* 129 of the 488 public objects are listed in the ``__all__`` of two to four modules
  (``GradSampleModule`` in ``dpnotebook``, ``dpnotebook.grad_sample`` and its home module).
  ``autosummary :recursive:`` either follows ``__all__`` (``autosummary_ignore_module_all =
  False``) and then documents each at every module that lists it, a duplicate-object warning
  per re-export under ``-W`` (or, with ``:no-index:``, entries nobody can link to), or, by
  default, skips imported names, so ``dpnotebook``'s own top-level names get no entry. Here each
  is documented once, at its home, and the other modules link there.
* A reference through any import path (``dpnotebook.PrivacyEngine``, an Opacus-style alias path)
  must resolve, and one that names nothing must fail the build: autosummary has no such resolver.
* ``autosummary_generate`` writes a stub file per object into the source tree, which is the
  repository root here (``-c docs``); these pages are generated in memory, and ``dpn_api_pages``
  groups 163 modules onto eight pages by concept, with ``"*"`` catching new modules.

The capability table, the modes sections, the widget outputs and the known-warnings filter have
no Sphinx or myst-nb equivalent at all.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging as stdlib_logging
import pkgutil
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.logging import WarningStreamHandler
from sphinx.util.nodes import make_refnode, nested_parse_with_titles

logger = logging.getLogger(__name__)

PACKAGE = "dpnotebook"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


# -- the public API, found by walking the package ---------------------------------------
@dataclass
class ApiObject:
    """One public object, documented once as ``f"{home}.{name}"``."""

    name: str
    home: str
    obj: Any
    kind: str  # class, exception, function or data
    listed_in: list[str] = field(default_factory=list)  # every module whose __all__ names it

    @property
    def fullname(self) -> str:
        return f"{self.home}.{self.name}"


@dataclass
class Api:
    modules: dict[str, ModuleType]
    objects: list[ApiObject]
    problems: list[str]

    def homed_in(self, modname: str) -> list[ApiObject]:
        return [o for o in self.objects if o.home == modname]

    def listed_by(self, modname: str) -> list[ApiObject]:
        order = {name: i for i, name in enumerate(self.modules[modname].__all__)}
        found = [o for o in self.objects if modname in o.listed_in]
        return sorted(found, key=lambda o: order.get(_name_in(o, modname), 0))


def _name_in(obj: ApiObject, modname: str) -> str:
    module = importlib.import_module(modname)
    for name in module.__all__:
        if getattr(module, name, None) is obj.obj:
            return name
    return obj.name


def _is_public(modname: str) -> bool:
    return not any(part.startswith("_") for part in modname.split("."))


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isroutine(obj):
        return "function"
    return "data"


def _key(obj: Any, name: str) -> Any:
    """Identity of an object; plain values (numbers, tuples, dicts) are told apart by name too."""
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return id(obj)
    return ("data", name, id(obj))


def collect_api() -> Api:
    """Import every public module of the package and assign each public name a home."""
    package = importlib.import_module(PACKAGE)
    modules: dict[str, ModuleType] = {PACKAGE: package}
    problems: list[str] = []

    def onerror(name: str) -> None:
        problems.append(f"cannot import {name} while walking the package")

    for info in pkgutil.walk_packages(package.__path__, PACKAGE + ".", onerror=onerror):
        if not _is_public(info.name):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as err:  # noqa: BLE001 - reported as a build warning
            problems.append(f"cannot import {info.name}: {type(err).__name__}: {err}")
            continue
        if hasattr(module, "__all__"):
            modules[info.name] = module

    places: dict[Any, list[tuple[str, str]]] = {}
    values: dict[Any, Any] = {}
    for modname, module in modules.items():
        for name in module.__all__:
            try:
                obj = getattr(module, name)
            except AttributeError:
                problems.append(f"{modname}.__all__ lists {name!r}, which {modname} does not define")
                continue
            if inspect.ismodule(obj):
                continue
            key = _key(obj, name)
            places.setdefault(key, []).append((modname, name))
            values[key] = obj

    objects = []
    for key, where in places.items():
        obj = values[key]
        defined_in = getattr(obj, "__module__", None) if _kind(obj) != "data" else None
        home = next((p for p in where if p[0] == defined_in), None)
        if home is None:  # defined in a private module, or a value: the most specific public module
            home = max(where, key=lambda p: (p[0].count("."), p[0] != PACKAGE, p[0]))
        objects.append(ApiObject(home[1], home[0], obj, _kind(obj), [m for m, _ in where]))
    return Api(modules, objects, problems)


def get_api(app: Sphinx) -> Api:
    """The API, collected once per build (modules are imported once anyway)."""
    if getattr(app, "_dpn_api", None) is None:
        app._dpn_api = collect_api()
        for problem in app._dpn_api.problems:
            logger.warning(problem, type="dpn", subtype="api")
    return app._dpn_api


def page_of(modname: str, pages: dict[str, list[str]]) -> str | None:
    """The API page that documents ``modname``: the most specific matching entry wins."""
    best, best_len = None, -1
    for docname, entries in pages.items():
        for entry in entries:
            if entry == "*":
                matched = 0
            elif entry == PACKAGE:
                matched = len(entry) if modname == PACKAGE else -1
            elif modname == entry or modname.startswith(entry + "."):
                matched = len(entry)
            else:
                matched = -1
            if matched > best_len:
                best, best_len = docname, matched
    return best


def _modules_for_page(docname: str, api: Api, pages: dict[str, list[str]]) -> list[str]:
    entries = pages[docname]
    found = [m for m in api.modules if page_of(m, pages) == docname]

    def order(modname: str) -> tuple:
        rank = next(
            (i for i, e in enumerate(entries) if e != "*" and (modname == e or modname.startswith(e + "."))),
            len(entries),
        )
        return (rank, modname)

    return sorted(found, key=order)


# -- rst generation ---------------------------------------------------------------------
def _summary(item: ApiObject) -> str:
    """The first paragraph of the object's docstring, on one line."""
    if item.kind == "data":
        docs = ModuleAnalyzer.for_module(item.home).find_attr_docs()
        lines = docs.get(("", item.name), [])
        text = "\n".join(lines)
    else:
        text = inspect.getdoc(item.obj) or ""
    first = text.strip().split("\n\n")[0]
    if first.startswith(">>>"):
        return ""
    return " ".join(line.strip() for line in first.splitlines())


def _table(items: list[ApiObject]) -> list[str]:
    """A two-column table: each name, linked to its documentation, and its summary."""
    lines = [".. list-table::", "   :widths: 35 65", "   :class: dpn-summary", ""]
    for item in items:
        lines += [f"   * - :py:obj:`{item.name} <{item.fullname}>`", f"     - {_summary(item) or ' '}"]
    return lines + [""]


def _object_directive(item: ApiObject) -> list[str]:
    directive = {"class": "autoclass", "exception": "autoexception", "function": "autofunction"}.get(
        item.kind, "autodata"
    )
    lines = [f".. {directive}:: {item.fullname}"]
    if item.kind in ("class", "exception"):
        lines += ["   :members:", "   :inherited-members:", "   :show-inheritance:"]
    return lines + [""]


def api_page_rst(docname: str, app: Sphinx) -> list[str]:
    """The reST of an API page."""
    api = get_api(app)
    lines: list[str] = []
    for modname in _modules_for_page(docname, api, app.config.dpn_api_pages):
        homed = api.homed_in(modname)
        elsewhere = [o for o in api.listed_by(modname) if o.home != modname]
        title = f"``{modname}``"
        lines += [title, "-" * len(title), "", f".. automodule:: {modname}", ""]
        if elsewhere and not homed:
            lines += [f"``{modname}`` gives you these names (each is documented where it is defined):", ""]
            lines += _table(elsewhere)
            continue
        if len(homed) > 1:
            lines += _table(homed)
        if elsewhere:
            links = ", ".join(f":py:obj:`{o.name} <{o.fullname}>`" for o in elsewhere)
            lines += [f"Also available here: {links}.", ""]
        for item in homed:
            lines += _object_directive(item)
    return lines


class ApiDirective(SphinxDirective):
    """``.. dpn-api::``: the modules that ``dpn_api_pages`` assigns to this page."""

    def run(self) -> list[nodes.Node]:
        docname = self.env.docname
        if docname not in self.config.dpn_api_pages:
            raise self.error(f"{docname} is not a key of dpn_api_pages in conf.py")
        lines = api_page_rst(docname, self.env.app)
        # Read again on every build: a new module or a new name in some __all__ can change
        # any API page, and which one cannot be known from the files the page depends on.
        self.env.dpn_always_read = getattr(self.env, "dpn_always_read", set()) | {docname}
        if not lines:
            lines = ["No public module is assigned to this page at the moment."]
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=f"<dpn-api {docname}>"), container)
        return container.children


# -- generated tables: capabilities and modes --------------------------------------------
class CapabilitiesDirective(SphinxDirective):
    """``.. dpn-capabilities::``: run every feature in every mode now, and show the result."""

    def run(self) -> list[nodes.Node]:
        from dpnotebook.capabilities import CapabilityRow, Cell, capability_markdown, capability_table

        self.env.dpn_always_read = getattr(self.env, "dpn_always_read", set()) | {self.env.docname}
        rows = capability_table()
        notes: list[str] = []
        compact = []
        for row in rows:
            cells = {}
            for mode, cell in row.cells.items():
                if cell.status == "WRONG":
                    logger.warning(
                        f"capability table: mode {mode!r} computes wrong per-sample gradients for "
                        f"{row.feature!r}: {cell.note}",
                        location=(self.env.docname, self.lineno),
                    )
                if cell.note:
                    notes.append(f"{mode}, {row.feature}: {cell.note}")
                    cells[mode] = Cell(cell.status, f"note {len(notes)}")
                else:
                    cells[mode] = cell
            compact.append(CapabilityRow(row.feature, cells))
        text = capability_markdown(compact)
        if notes:
            text += "\n\n" + "\n".join(f"{i}. {_escape_md(note)}" for i, note in enumerate(notes, 1))
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(text.splitlines()), self.content_offset, container)
        return container.children


def _escape_md(text: str) -> str:
    return re.sub(r"([*_`<>\[\]])", r"\\\1", text)


class ModesDirective(SphinxDirective):
    """``.. dpn-modes::``: every registered mode, its wrapper class and that class's summary."""

    def run(self) -> list[nodes.Node]:
        from dpnotebook.modes import available_modes

        self.env.dpn_always_read = getattr(self.env, "dpn_always_read", set()) | {self.env.docname}
        lines = ["| mode | wrapper | what it does |", "|---|---|---|"]
        for mode in available_modes():
            cls = _mode_wrapper(mode)
            name = f"{{py:class}}`{cls.__name__} <{cls.__module__}.{cls.__qualname__}>`"
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0]
            summary = " ".join(doc.split()).replace("|", "\\|")
            lines.append(f"| `{mode}` | {name} | {_rst_literals_to_md(summary)} |")
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


def _mode_wrapper(mode: str) -> type:
    from dpnotebook.modes import mode_class

    return mode_class(mode)


class ModeSectionsDirective(SphinxDirective):
    """``.. dpn-mode-sections::``: a section per registered mode, from ``docs/_modes/<mode>.md``.

    A mode without such a file gets its wrapper class's docstring; a file for a mode
    that is not registered is left out. Sections come in ``dpn_mode_order``, then by name.
    """

    def run(self) -> list[nodes.Node]:
        from pathlib import Path

        from dpnotebook.modes import available_modes

        self.env.dpn_always_read = getattr(self.env, "dpn_always_read", set()) | {self.env.docname}
        folder = Path(self.env.app.confdir) / "_modes"
        order = list(self.config.dpn_mode_order)
        modes = sorted(available_modes(), key=lambda m: (order.index(m) if m in order else len(order), m))
        container = nodes.section()
        container.document = self.state.document
        for mode in modes:
            path = folder / f"{mode}.md"
            if path.exists():
                self.env.note_dependency(str(path))
                text = path.read_text()
            else:
                doc = inspect.getdoc(_mode_wrapper(mode))
                text = f"## `{mode}`\n\n" + _rst_literals_to_md(doc or "(This mode has no description yet.)")
            self.state.nested_parse(StringList(text.splitlines(), source=str(path)), 0, container, match_titles=True)
        return container.children


def _rst_literals_to_md(text: str) -> str:
    """``x`` (reST literal) to `x`, and :role:`x` to {role}`x`, for a MyST page."""
    text = re.sub(r":(\w+:\w+|\w+):`", r"{\1}`", text)
    return text.replace("``", "`")


def always_read(app: Sphinx, env: Any, added: set, changed: set, removed: set) -> list[str]:
    """Pages whose content is computed at build time are read again on every build."""
    return sorted(getattr(env, "dpn_always_read", set()) - removed)


def check_api_pages(app: Sphinx, env: Any) -> None:
    """Every page named in dpn_api_pages exists and every public module has a page."""
    for docname in app.config.dpn_api_pages:
        if docname not in env.found_docs:
            logger.warning(f"dpn_api_pages names {docname}, which is not a document", type="dpn", subtype="api")


# -- references through any import path ---------------------------------------------------
_MISSING = object()


def _import(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 - any failure means "not this prefix"
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except Exception:  # noqa: BLE001
            return _MISSING
        return obj
    return _MISSING


def _identity(obj: Any) -> Any:
    obj = getattr(obj, "__func__", obj)  # bound and class methods
    if isinstance(obj, (str, int, float, bool, bytes, type(None))):
        return None  # too ambiguous to identify by value
    return id(obj)


def _object_index(app: Sphinx) -> dict[Any, tuple[str, str, str]]:
    """id(python object) -> (docname, node id, full name) for everything documented."""
    index = getattr(app, "_dpn_ref_index", None)
    if index is None:
        index, keep = {}, []
        for name, entry in app.env.get_domain("py").objects.items():
            if entry.aliased:
                continue
            obj = _import(name)
            key = _identity(obj) if obj is not _MISSING else None
            if key is not None:
                index.setdefault(key, (entry.docname, entry.node_id, name))
                keep.append(obj)  # ids stay valid while the objects live
        app._dpn_ref_index, app._dpn_ref_keep = index, keep
    return index


def _excluded(app: Sphinx, node: nodes.Node) -> bool:
    """Inside an ``only`` block that this build leaves out (e.g. a mode not registered here)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, addnodes.only) and not app.tags.eval_condition(parent["expr"]):
            return True
        parent = parent.parent
    return False


def resolve_reference(app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Node) -> nodes.Node | None:
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [f"{module}.{cls}.{target}"] if module and cls else []
    candidates += [f"{module}.{target}"] if module else []
    candidates.append(target)
    for candidate in candidates:
        obj = _import(candidate)
        if obj is _MISSING:
            continue
        found = _object_index(app).get(_identity(obj))
        if found is None:
            return None  # not ours, or not public: plain text
        docname, node_id, fullname = found
        return make_refnode(app.builder, node["refdoc"], docname, node_id, contnode, fullname)
    if target.startswith(PACKAGE + ".") and not _excluded(app, node):
        logger.warning(
            f"reference to {target!r}, which dpnotebook does not define", location=node, type="dpn", subtype="ref"
        )
    return None


def skip_foreign_members(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    """Document inherited members only when dpnotebook defines them (not torch's or traitlets')."""
    if what not in ("class", "exception"):
        return None
    target = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    module = getattr(target, "__module__", None)
    if (inspect.isroutine(target) or isinstance(obj, property)) and module and not module.startswith(PACKAGE):
        return True
    return None


def add_import_line(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Under each documented object, the shortest import path (``from dpnotebook import X``).

    A constant without a ``#:`` comment would show its type's docstring (``dict``'s,
    say); that is dropped.
    """
    if what not in ("class", "exception", "function", "data"):
        return
    if what == "data" and not inspect.isclass(obj) and not inspect.isroutine(obj):
        type_doc = inspect.cleandoc(getattr(type(obj), "__doc__", None) or "")
        if type_doc and "\n".join(lines).strip() == type_doc.strip():
            lines[:] = []
    api = get_api(app)
    item = next((o for o in api.objects if o.fullname == name), None)
    if item is None:
        return
    shortest = min(item.listed_in, key=lambda m: (m.count("."), m))
    if shortest == item.home:
        return
    paragraph_end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    lines[paragraph_end:paragraph_end] = ["", f"*Import it as* ``from {shortest} import {item.name}``.", ""]


# -- notebook widget outputs --------------------------------------------------------------
class WidgetOutputs(SphinxPostTransform):
    """Before myst-nb picks one format per output: live widget, PNG until it is drawn, or fallback."""

    default_priority = 3  # myst-nb's SelectMimeType runs at 4
    formats = ("html",)

    def run(self, **kwargs: Any) -> None:
        from myst_nb.sphinx_ import NbMetadataCollector

        state = NbMetadataCollector.get_js_files(self.env, self.env.docname).get("ipywidgets_state")
        models = set(json.loads(state[1]["body"]).get("state", {})) if state else set()

        def is_bundle(node: nodes.Node) -> bool:
            return isinstance(node, nodes.container) and node.get("nb_element") == "mime_bundle"

        for bundle in list(self.document.findall(is_bundle)):
            outputs = {child.get("mime_type"): child for child in bundle.children}
            view = outputs.get(WIDGET_VIEW)
            if view is None:
                continue
            found = re.search(r'"model_id"\s*:\s*"([^"]+)"', view.astext())
            if found and found.group(1) in models:
                picture = outputs.get("image/png") or outputs.get("image/svg+xml")
                if picture is not None:
                    live = nodes.container(classes=["dpn-widget"])
                    live.extend(view.children)
                    fallback = nodes.container(classes=["dpn-widget-fallback"])
                    fallback.extend(picture.children)
                    live.append(fallback)
                    bundle.replace_self(live)
                continue
            bundle.remove(view)
            if not set(outputs) & {"image/png", "image/svg+xml", "image/jpeg", "text/html"}:
                logger.warning(
                    "a widget output has no saved widget state, so the page shows only its text. Save "
                    "the notebook with its widget state (JupyterLab: Settings > Save Widget State "
                    "Automatically, then run all cells and save)",
                    location=bundle,
                    type="dpn",
                    subtype="widget",
                )


# -- known warnings in docstrings owned elsewhere -------------------------------------------
class KnownWarnings(stdlib_logging.Filter):
    """Drops the warnings listed in ``dpn_known_warnings``: ``(where, message)`` substrings.

    Each entry is a docstring problem waiting for its owner; the build says which
    entries matched nothing, so they can be removed once the docstring is fixed.
    """

    def __init__(self, known: list[tuple[str, str]]) -> None:
        super().__init__()
        self.known = [tuple(entry) for entry in known]
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: stdlib_logging.LogRecord) -> bool:
        location = getattr(record, "location", None)
        if isinstance(location, nodes.Node):
            location = f"{location.source}:{location.line}"
        text = f"{location or ''} {record.getMessage()}"
        for where, message in self.known:
            if where in text and message in text:
                self.seen.add((where, message))
                return False
        return True


def install_known_warnings(app: Sphinx) -> None:
    known = KnownWarnings(app.config.dpn_known_warnings)
    app._dpn_known = known
    for handler in stdlib_logging.getLogger("sphinx").handlers:
        if isinstance(handler, WarningStreamHandler):
            handler.filters.insert(0, known)


def report_known_warnings(app: Sphinx, exception: BaseException | None) -> None:
    known = getattr(app, "_dpn_known", None)
    if exception is None and known is not None:
        for entry in known.known:
            if entry not in known.seen:
                logger.info(f"dpn_known_warnings: {entry} no longer occurs; remove it from docs/conf.py")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("dpn_api_pages", {}, "env")
    app.add_config_value("dpn_known_warnings", [], "")
    app.connect("builder-inited", install_known_warnings)
    app.connect("build-finished", report_known_warnings)
    app.add_directive("dpn-api", ApiDirective)
    app.add_directive("dpn-capabilities", CapabilitiesDirective)
    app.add_directive("dpn-modes", ModesDirective)
    app.add_directive("dpn-mode-sections", ModeSectionsDirective)
    app.add_config_value("dpn_mode_order", [], "env")
    app.connect("env-get-outdated", always_read)
    app.connect("env-check-consistency", check_api_pages)
    app.connect("missing-reference", resolve_reference)
    app.connect("autodoc-skip-member", skip_foreign_members)
    app.connect("autodoc-process-docstring", add_import_line)
    app.add_post_transform(WidgetOutputs)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
