"""The real-browser tutorial check: one JupyterLab server and one headless Chromium for all notebooks.

Skipped, loudly, where there is no Chromium (``/usr/bin/chromium``; ``.ci/run``
installs Debian's) or no ``playwright`` Python package. Nothing downloads a browser.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from browserlab import CHROMIUM_ARGS, SKIPPED, TUTORIALS, LabServer, NotebookDriver, find_chromium, tutorial_bytes


def browser_missing() -> str | None:
    """Why the browser check cannot run here, or ``None``."""
    if find_chromium() is None:
        return (
            f"{SKIPPED}: no Chromium (/usr/bin/chromium, or `chromium` on the PATH). "
            "Install it with `apt-get install -y chromium` (.ci/run does); never `playwright install`."
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"{SKIPPED}: the Python package `playwright` is not installed (`pip install playwright`)."
    return None


def notebook7_missing() -> str | None:
    """Why Notebook 7 cannot be checked here (no browser, no ``notebook`` 7.x), or ``None``."""
    reason = browser_missing()
    if reason:
        return reason
    try:
        import notebook
    except ImportError:
        return (
            f"{SKIPPED}: the Python package `notebook` (Notebook 7) is not installed "
            "(`pip install 'notebook>=7' -c constraints.txt`, or the `lab` extra)."
        )
    version = getattr(notebook, "__version__", "0")
    if int(version.split(".")[0]) != 7:
        return f"{SKIPPED}: `notebook` {version} is installed; the Notebook 7 check needs 7.x."
    return None


@contextlib.contextmanager
def browser_session(root: Path, work: Path, app: str = "lab") -> Iterator[NotebookDriver]:
    """A server (``app``: ``"lab"`` or ``"notebook"``) on ``root`` and a headless Chromium page on it;
    both stopped at the end (the server by its process group)."""
    from playwright.sync_api import sync_playwright

    server = LabServer(root, work, app=app)
    playwright = context = None
    try:
        server.launch()  # the server boots while Chromium starts
        playwright = sync_playwright().start()
        context = playwright.chromium.launch_persistent_context(
            str(work / "chromium-profile"),  # a fresh profile
            executable_path=find_chromium(),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            accept_downloads=False,
        )
        context.set_default_timeout(60_000)
        page = context.pages[0] if context.pages else context.new_page()
        server.wait_ready()
        driver = NotebookDriver(page, server)
        driver.load()
        yield driver
    finally:
        try:
            if context is not None:
                context.close()
            if playwright is not None:
                playwright.stop()
        finally:
            server.stop()


@pytest.fixture(scope="module")
def tutorial_copy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A copy of ``tutorials/`` to run (JupyterLab saves there, never in the checkout) and the
    originals' bytes at the time of the copy."""
    before = tutorial_bytes()
    copy = tmp_path_factory.mktemp("browser") / "tutorials"
    shutil.copytree(TUTORIALS, copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return copy, before


@pytest.fixture(scope="module")
def lab(tutorial_copy: tuple[Path, dict[str, bytes]], tmp_path_factory: pytest.TempPathFactory):
    """A :class:`~browserlab.NotebookDriver` on a JupyterLab page in headless Chromium."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    with browser_session(tutorial_copy[0], tmp_path_factory.mktemp("browser-lab")) as driver:
        yield driver


def pytest_terminal_summary(terminalreporter) -> None:
    """Say it loudly, at the end of the run, when the browser check was skipped."""
    reasons = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        if SKIPPED in text:
            reasons.add(text[text.index(SKIPPED) :])
    for reason in sorted(reasons):
        terminalreporter.write_sep("!", SKIPPED, red=True, bold=True)
        terminalreporter.write_line(reason, red=True, bold=True)
        terminalreporter.write_sep("!", red=True, bold=True)
