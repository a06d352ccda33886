"""The documentation builds with warnings as errors, and shows what it promises.

The build runs once per test session (``make test``), into a temporary folder, with
the command of ``make docs``. A broken reference, a docstring that is not valid
reStructuredText, a tutorial that no longer renders or a widget output saved without
its state is a Sphinx warning, hence a failure here.
"""

from __future__ import annotations

import html as html_module
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-c", "docs", "-b", "html", "."]


@pytest.fixture(scope="session")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    result = subprocess.run([*SPHINX, str(out)], cwd=ROOT, capture_output=True, text=True)
    warnings = "\n".join(line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line)
    assert result.returncode == 0, (
        f"the docs do not build with warnings as errors (`make docs` shows the same):\n{warnings}\n\n"
        f"{result.stderr[-6000:]}"
    )
    return out


def page(html: Path, name: str) -> str:
    return (html / name).read_text(encoding="utf-8")


@pytest.mark.slow  # the Sphinx build
def test_the_site_has_its_sections(html: Path) -> None:
    index = page(html, "docs/index.html")
    for target in ("getting-started.html", "concepts/index.html", "tutorials.html", "api/index.html"):
        assert f'href="{target}"' in index, target
    assert "url=docs/index.html" in page(html, "index.html")  # the top-level redirect


@pytest.mark.slow  # the Sphinx build
@pytest.mark.parametrize("notebook", TUTORIALS, ids=lambda p: p.name)
def test_every_tutorial_is_rendered_with_its_outputs(html: Path, notebook: Path) -> None:
    text = page(html, f"tutorials/{notebook.stem}.html")
    assert f'href="../tutorials/{notebook.stem}.html"' in page(html, "docs/tutorials.html")
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    printed = [
        "".join(o["text"]).strip()
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for o in cell.get("outputs", [])
        if o.get("output_type") == "stream" and "".join(o["text"]).strip()
    ]
    if printed:  # a stored output appears on the page, so outputs are rendered, not executed
        first_line = printed[0].splitlines()[0].strip()
        assert first_line in _text(text), f"{notebook.name}: stored output {first_line!r} is not on the page"


@pytest.mark.slow  # the Sphinx build
@pytest.mark.parametrize("notebook", TUTORIALS, ids=lambda p: p.name)
def test_cells_tagged_remove_cell_are_not_on_the_page(html: Path, notebook: Path) -> None:
    """Assertion cells (tag ``remove-cell``) run under nbval but stay off the site; the cells around them show."""
    text = _text(page(html, f"tutorials/{notebook.stem}.html"))
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    shown, hidden = [], []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
        if lines:
            (hidden if "remove-cell" in cell["metadata"].get("tags", []) else shown).append(lines[0])
    for line in hidden:
        if not any(line in visible for visible in shown):  # a line a visible cell also holds proves nothing
            assert line not in text, f"{notebook.name}: a cell tagged remove-cell is on the page: {line!r}"
    assert all(line in text for line in shown[:3]), f"{notebook.name}: the visible cells are missing"


@pytest.mark.slow  # the Sphinx build
@pytest.mark.parametrize("notebook", TUTORIALS, ids=lambda p: p.name)
def test_widget_state_comes_with_the_widget_manager(html: Path, notebook: Path) -> None:
    from ipywidgets.embed import DEFAULT_EMBED_REQUIREJS_URL

    text = page(html, f"tutorials/{notebook.stem}.html")
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    manager = DEFAULT_EMBED_REQUIREJS_URL in text and "require.min.js" in text
    if state.get("state"):
        assert 'type="application/vnd.jupyter.widget-state+json"' in text
        assert manager, "the page has widget state but does not load the widget manager"
        views = re.findall(r'type="application/vnd.jupyter.widget-view\+json">(.*?)</script>', text, re.S)
        for view in views:
            assert json.loads(view.replace("<\\/", "</"))["model_id"] in state["state"]
    else:
        assert not manager, "the widget manager is loaded on a page without widget state"


@pytest.mark.slow  # the Sphinx build
def test_capability_table_is_generated_from_the_code(html: Path) -> None:
    from dpnotebook.capabilities import FEATURES
    from dpnotebook.modes import available_modes

    text = page(html, "docs/concepts/modes.html")
    header = re.search(r"<thead>(.*?)</thead>", text[text.index("What each mode can do") :], re.S).group(1)
    for mode in available_modes():
        assert f">{mode}<" in header
    for feature in FEATURES:
        assert feature in _text(text), feature


@pytest.mark.slow  # the Sphinx build
def test_every_public_name_has_an_api_entry(html: Path) -> None:
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from dpn_docs import collect_api
    finally:
        sys.path.pop(0)
    api_html = "".join(p.read_text(encoding="utf-8") for p in (html / "docs" / "api").glob("*.html"))
    missing = [o.fullname for o in collect_api().objects if f'id="{o.fullname}"' not in api_html]
    assert not missing, f"no API entry for: {missing}"


def _dpn_docs() -> object:
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import dpn_docs
    finally:
        sys.path.pop(0)
    return dpn_docs


def test_every_name_of_every_face_is_on_the_one_api_page() -> None:
    """The reST the ``dpn-api`` directive writes (no Sphinx build): one page, every face's name on it."""
    import ast
    import importlib
    from types import SimpleNamespace

    conf = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    assigned = {
        target.id: node.value
        for node in conf.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    faces = ast.literal_eval(assigned["FACES"])
    assert ast.unparse(assigned["dpn_api_pages"]) == "{'docs/api/index': [*FACES, '*']}"
    assert sorted(p.name for p in (ROOT / "docs" / "api").iterdir()) == ["index.rst"]
    dpn_docs = _dpn_docs()
    app = SimpleNamespace(config=SimpleNamespace(dpn_api_pages={"docs/api/index": [*faces, "*"]}), _dpn_api=None)
    rst = "\n".join(dpn_docs.api_page_rst("docs/api/index", app))  # type: ignore[attr-defined]
    documented = set(re.findall(r"^\.\. auto\w+:: (\S+)$", rst, re.M))
    sections = set(re.findall(r"^``([\w.]+)``\n-+$", rst, re.M))
    homes = {id(o.obj): o.fullname for o in app._dpn_api.objects}
    missing = []
    for face in faces:
        module = importlib.import_module(face)
        assert face in sections, face
        for name in module.__all__:
            obj = getattr(module, name)
            if homes.get(id(obj), f"{face}.{name}") not in documented:
                missing.append(f"{face}.{name}")
    assert len(faces) == 5 and not missing, f"not on the API page: {missing}"
    assert not app._dpn_api.problems, app._dpn_api.problems


def test_the_build_needs_no_network() -> None:
    conf = (ROOT / "docs" / "conf.py").read_text(encoding="utf-8")
    assert "sphinx.ext.intersphinx" not in conf


def _text(page_html: str) -> str:
    """What a reader sees: the page without its tags."""
    return html_module.unescape(re.sub(r"<[^>]+>", "", page_html))


@pytest.mark.slow  # the Sphinx build
def test_mathjax_is_part_of_the_site(html: Path) -> None:
    """Formulas render offline: every page with math loads MathJax from the site's own _static, not a CDN."""
    text = page(html, "docs/concepts/accounting.html")
    scripts = re.findall(r'<script[^>]*src="([^"]*(?:mathjax|MathJax)[^"]*)"', text)
    assert scripts == ["../../_static/mathjax/tex-chtml.js"], scripts
    static = html / "_static" / "mathjax"
    assert (static / "tex-chtml.js").stat().st_size > 100_000
    assert list((static / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    for name in ("docs/index.html", "tutorials/04_noise_and_privacy_budget.html"):
        assert not re.search(r'<script[^>]*src="https?://[^"]*mathjax', page(html, name), re.I), name


@pytest.mark.slow  # the Sphinx build
def test_the_tutorials_page_says_what_needs_a_network_and_a_kernel(html: Path) -> None:
    text = " ".join(_text(page(html, "docs/tutorials.html")).split())
    assert "The formulas render offline" in text
    assert "loads from a CDN" in text and "offline they do not appear" in text
    assert "Sliders that recompute need a running kernel" in text


@pytest.mark.slow  # the Sphinx build
def test_formulas_render_in_a_browser_without_network(html: Path) -> None:
    """Headless Chromium, every http(s) request refused: MathJax from _static typesets the page's formulas.

    Skipped, loudly, without Debian's Chromium or the playwright package (as tests/browser is);
    .ci/run installs Chromium.
    """
    import os
    import shutil

    chromium = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")
    if chromium is None:
        pytest.skip("OFFLINE-MATH BROWSER CHECK SKIPPED: no Chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="OFFLINE-MATH BROWSER CHECK SKIPPED: no playwright")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context()
            refused: list[str] = []
            context.route("http*://**", lambda route: (refused.append(route.request.url), route.abort()))
            view = context.new_page()
            view.goto((html / "docs" / "concepts" / "dp-sgd.html").as_uri())
            view.wait_for_selector("mjx-container", state="attached", timeout=30_000)
            typeset = view.evaluate("document.querySelectorAll('mjx-container').length")
            raw = view.evaluate("document.body.innerText.includes('\\\\(')")
        finally:
            browser.close()
    assert typeset >= 10 and not raw, (typeset, raw)
    assert not [u for u in refused if "mathjax" in u.lower()], refused
