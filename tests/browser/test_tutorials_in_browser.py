"""Every tutorial, run through JupyterLab's UI in a real (headless) Chromium, as a reader would.

For each ``tutorials/*.ipynb`` (a copy; the checkout is never written): open it,
run all cells with ``notebook:run-all-cells``, wait for the end, and fail on an
error output, a widget that did not render (or shows "Error displaying widget" /
"Click to show javascript error", or an ipympl canvas that was never drawn), a
kernel that died or restarted, or an open dialog. A picture of each notebook goes
to ``build/browser-screenshots/<name>.png``.

In the clipping tutorial (``03_*``) the ``ClippingExplorer``'s C slider is moved,
with the keyboard and with the mouse, and its readout, caption and figure must
follow.

Needs Chromium (``/usr/bin/chromium``) and the ``playwright`` package; skipped
loudly without them (see ``conftest.py``).
"""

from __future__ import annotations

import os
import sys

import pytest
from browserlab import SCREENSHOTS, TUTORIALS, NotebookDriver, find_widget_output, tutorial_bytes

NOTEBOOKS = sorted(p.name for p in TUTORIALS.glob("*.ipynb"))
RUN_TIMEOUT_S = 240  # per notebook
CLIPPING_TUTORIAL = "03_"
EXPLORER_CALL = "ClippingExplorer("

#: name -> what the slider check saw, filled by the 03 case and read by test_clipping_slider_was_checked
SLIDER_CHECKS: dict[str, list[str]] = {}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_tutorial_runs_in_browser(lab: NotebookDriver, name: str) -> None:
    stem = name.removesuffix(".ipynb")
    try:
        report = lab.run_all(name, timeout=RUN_TIMEOUT_S)
    finally:
        try:  # the picture is most useful when something went wrong
            lab.screenshot(SCREENSHOTS / f"{stem}.png")
        except Exception as exc:  # noqa: BLE001 - never hide the real failure
            print(f"screenshot of {name} failed: {exc}")
    print(f"{name}: ran in {report.seconds:.1f} s in the browser")
    assert os.path.samefile(report.kernel_prefix, sys.prefix), (
        f"the notebook ran on a kernel from {report.kernel_prefix!r}, not this environment ({sys.prefix!r})"
    )
    if report.problems:
        pytest.fail(report.explain(), pytrace=False)

    if name.startswith(CLIPPING_TUTORIAL):
        cell = find_widget_output(report.notebook, EXPLORER_CALL)
        assert cell is not None, f"{name} shows no widget from a code cell calling {EXPLORER_CALL}...) on"
        SLIDER_CHECKS[name] = lab.check_slider_moves_figure(cell, shots=SCREENSHOTS / f"{stem}-slider.png")
        print("\n".join(SLIDER_CHECKS[name]))


def test_clipping_slider_was_checked(lab: NotebookDriver) -> None:
    """The clipping tutorial's slider was moved in the browser (not silently left out)."""
    clipping = [n for n in NOTEBOOKS if n.startswith(CLIPPING_TUTORIAL)]
    if not clipping:
        pytest.skip(f"no tutorials/{CLIPPING_TUTORIAL}*.ipynb yet")
    missing = [n for n in clipping if n not in SLIDER_CHECKS]
    assert not missing, (
        f"the ClippingExplorer slider was not checked in {missing}: "
        f"see test_tutorial_runs_in_browser[{missing[0]}] (failed or deselected)"
    )


def test_tutorials_on_disk_unchanged(tutorial_copy) -> None:
    """Running the tutorials in the browser left the checkout's notebooks byte for byte as they were.

    (Notebooks added to tutorials/ meanwhile are not this run's; an editor saving one during
    the run would show up here.)
    """
    _, before = tutorial_copy
    after = tutorial_bytes()
    changed = sorted(n for n in before if before[n] != after.get(n))
    if changed:
        pytest.fail(f"tutorials changed on disk during the browser run: {changed}", pytrace=False)
