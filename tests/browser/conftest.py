"""The real-browser tutorial check: one JupyterLab server and one headless Chromium for all notebooks.

Skipped, loudly, where there is no Chromium (``/usr/bin/chromium``; ``.ci/run``
installs Debian's) or no ``playwright`` Python package. Nothing downloads a browser.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from browserlab import CHROMIUM_ARGS, SKIPPED, TUTORIALS, LabServer, NotebookDriver, find_chromium, tutorial_bytes


def browser_missing() -> str | None:
    """Why the browser check cannot run here, or ``None``."""
    if find_chromium() is None:
        return (f"{SKIPPED}: no Chromium (/usr/bin/chromium, or `chromium` on the PATH). "
                "Install it with `apt-get install -y chromium` (.ci/run does); never `playwright install`.")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"{SKIPPED}: the Python package `playwright` is not installed (`pip install playwright`)."
    return None


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
    from playwright.sync_api import sync_playwright

    work = tmp_path_factory.mktemp("browser-lab")
    server = LabServer(tutorial_copy[0], work)
    playwright = context = None
    try:
        server.launch()  # the server boots while Chromium starts
        playwright = sync_playwright().start()
        context = playwright.chromium.launch_persistent_context(
            str(work / "chromium-profile"),  # a fresh profile
            executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, accept_downloads=False,
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


def pytest_terminal_summary(terminalreporter) -> None:
    """Say it loudly, at the end of the run, when the browser check was skipped."""
    reasons = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        if SKIPPED in text:
            reasons.add(text[text.index(SKIPPED):])
    for reason in sorted(reasons):
        terminalreporter.write_sep("!", SKIPPED, red=True, bold=True)
        terminalreporter.write_line(reason, red=True, bold=True)
        terminalreporter.write_sep("!", red=True, bold=True)
