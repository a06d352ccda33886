"""Every explorer under ``%matplotlib widget`` (the ipympl backend), in JupyterLab in headless Chromium.

A throwaway notebook (written into a temp folder, never into ``tutorials/``) runs
``%matplotlib widget`` and displays each explorer, one per cell. Through the real
UI: every cell runs without an error output and every widget renders (the
harness's checks), every explorer shows exactly one ipympl canvas, each canvas
has a non-zero size and draws pixels that are not all one colour, and moving one
explorer's slider (keyboard and mouse) changes its canvas's pixels.

Needs Chromium and ``playwright``; skipped loudly without them (see ``conftest.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browserlab import SCREENSHOTS, NotebookDriver, find_widget_output, wait_for
from explorer_cells import FIGURES_JS, IMPORTS, SLIDER_CELL, explorer_cell_indices, explorer_notebook, figure_problem

NOTEBOOK = "ipympl_explorers.ipynb"
RUN_TIMEOUT_S = 240

SETUP = "%matplotlib widget\n" + IMPORTS + "assert ipympl_active(), 'the explorers would not use ipympl'"


@pytest.fixture(scope="module")
def tutorial_copy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """Overrides conftest's fixture of the same name: the folder the ``lab`` fixture serves is a
    temp folder holding only the throwaway notebook."""
    root = tmp_path_factory.mktemp("ipympl") / "notebooks"
    root.mkdir()
    (root / NOTEBOOK).write_text(json.dumps(explorer_notebook(SETUP), indent=1))
    return root, {}


def test_explorers_draw_with_ipympl(lab: NotebookDriver) -> None:
    try:
        report = lab.run_all(NOTEBOOK, timeout=RUN_TIMEOUT_S)
    finally:
        try:
            lab.screenshot(SCREENSHOTS / "ipympl-explorers.png")
        except Exception as exc:  # noqa: BLE001 - never hide the real failure
            print(f"screenshot failed: {exc}")
    print(f"{NOTEBOOK}: ran in {report.seconds:.1f} s in the browser")
    if report.problems:
        pytest.fail(report.explain(), pytrace=False)

    cells = explorer_cell_indices(report.notebook)
    problems = []

    def drawn() -> bool:
        problems.clear()
        for name, index in cells.items():
            canvases = [f for f in lab.js(FIGURES_JS, index) if f["kind"] == "canvas"]
            if len(canvases) != 1:
                problems.append(f"{name}: {len(canvases)} ipympl canvases (expected 1)")
                continue
            problem = figure_problem(f"{name}: canvas", canvases[0])
            if problem:
                problems.append(problem)
        return not problems

    try:
        wait_for(drawn, 30, "every ipympl canvas to be drawn", interval=0.5)
    except TimeoutError:
        pytest.fail("under %matplotlib widget:\n  " + "\n  ".join(problems), pytrace=False)
    for name, index in cells.items():
        canvases = [f for f in lab.js(FIGURES_JS, index) if f["kind"] == "canvas"]
        print(f"{name}: {canvases[0]}")

    cell = find_widget_output(report.notebook, SLIDER_CELL)
    assert cell is not None and cell == cells["ClippingExplorer"]
    for line in lab.check_slider_moves_figure(cell, shots=SCREENSHOTS / "ipympl-clipping-slider.png"):
        print(line)
