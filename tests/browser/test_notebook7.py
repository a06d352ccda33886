"""Every explorer in Notebook 7 (the ``notebook`` package, 7.x), in headless Chromium.

Two throwaway notebooks (written into a temp folder, never into ``tutorials/``)
display each explorer, one per cell: one with the default backend (the explorers
then show an ``ipywidgets.Image``), one under ``%matplotlib widget`` (an ipympl
canvas). Each is opened in Notebook 7's own ``/notebooks/<path>`` page and run
with its ``notebook:run-all-cells`` command (Notebook 7 is built on JupyterLab's
components; ``--JupyterNotebookApp.expose_app_in_browser`` gives
``window.jupyterapp``). Checked, through the real UI: no error output, every
widget renders, no "Error displaying widget" / "Click to show javascript error"
on the page, no kernel restart (the harness's checks); every explorer's figure
(``img`` or ``canvas``) has a non-zero size and pixels that are not blank; and
dragging the ClippingExplorer's ``C`` slider with the mouse changes its figure,
readout and caption. (Not the arrow keys: Notebook 7 7.6 sends them, on a
focused slider handle in command mode, to its heading-navigation shortcuts.)

Needs Chromium, ``playwright`` and ``notebook`` 7; skipped loudly without them
(see ``conftest.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from browserlab import SCREENSHOTS, NotebookDriver, find_widget_output, wait_for
from explorer_cells import FIGURES_JS, IMPORTS, SLIDER_CELL, explorer_cell_indices, explorer_notebook, figure_problem

from conftest import browser_session, notebook7_missing

RUN_TIMEOUT_S = 240

#: notebook name -> (setup cell, the figure element each explorer shows)
NOTEBOOKS = {
    "nb7_default_backend.ipynb": (IMPORTS + "assert not ipympl_active(), 'ipympl is active by default'", "img"),
    "nb7_ipympl.ipynb": ("%matplotlib widget\n" + IMPORTS + "assert ipympl_active(), 'ipympl is not active'", "canvas"),
}


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> NotebookDriver:
    """A :class:`~browserlab.NotebookDriver` on a Notebook 7 server serving a temp folder that holds
    only the throwaway notebooks."""
    reason = notebook7_missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("notebook7") / "notebooks"
    root.mkdir()
    for name, (setup, _) in NOTEBOOKS.items():
        (root / name).write_text(json.dumps(explorer_notebook(setup), indent=1))
    with browser_session(root, tmp_path_factory.mktemp("browser-nb7"), app="notebook") as driver:
        yield driver


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_explorers_in_notebook7(notebook7: NotebookDriver, name: str) -> None:
    kind = NOTEBOOKS[name][1]
    stem = Path(name).stem
    try:
        report = notebook7.run_all(name, timeout=RUN_TIMEOUT_S)
    finally:
        try:
            notebook7.screenshot(SCREENSHOTS / f"{stem}.png")
        except Exception as exc:  # noqa: BLE001 - never hide the real failure
            print(f"screenshot failed: {exc}")
    print(f"{name}: ran in {report.seconds:.1f} s in Notebook 7")
    if report.problems:
        pytest.fail(report.explain(), pytrace=False)
    prefix = notebook7.kernel_prefix()
    assert prefix == sys.prefix, f"the notebook's kernel runs in {prefix}, not this environment ({sys.prefix})"

    cells = explorer_cell_indices(report.notebook)
    problems: list[str] = []

    def drawn() -> bool:
        problems.clear()
        for explorer, index in cells.items():
            figures = [f for f in notebook7.js(FIGURES_JS, index) if f["kind"] == kind]
            if not figures:
                problems.append(f"{explorer}: no {kind} in its output")
                continue
            big = max(figures, key=lambda f: f["width"] * f["height"])
            problem = figure_problem(f"{explorer}: {kind}", big)
            if problem:
                problems.append(problem)
        return not problems

    try:
        wait_for(drawn, 30, f"every explorer's {kind} to be drawn", interval=0.5)
    except TimeoutError:
        pytest.fail(f"{name} in Notebook 7:\n  " + "\n  ".join(problems), pytrace=False)
    for explorer, index in cells.items():
        big = max(
            (f for f in notebook7.js(FIGURES_JS, index) if f["kind"] == kind), key=lambda f: f["width"] * f["height"]
        )
        print(f"{explorer}: {big}")

    cell = find_widget_output(report.notebook, SLIDER_CELL)
    assert cell is not None and cell == cells["ClippingExplorer"]
    label = notebook7.js(
        "i => { const s = window.__dpnb.panel.content.widgets[i].outputArea.node"
        ".querySelector('.widget-slider .widget-label'); return s ? s.innerText.trim() : null; }",
        cell,
    )
    assert label == "C", f"the ClippingExplorer's first slider is {label!r}, not C"
    # a mouse drag only: in Notebook 7 (7.6) the arrow keys on a focused slider handle go to the
    # notebook's command-mode shortcuts (notebook:move-cursor-heading-below-or-expand), not the slider
    for line in notebook7.check_slider_moves_figure(
        cell, shots=SCREENSHOTS / f"{stem}-clipping-slider.png", ways=("mouse drag",)
    ):
        print(line)
