"""The throwaway notebooks the widget-backend checks open: one explorer per cell.

Shared by ``test_widget_backends.py`` (JupyterLab, ipympl) and ``test_notebook7.py``
(Notebook 7, both backends); they are written into temp folders, never into ``tutorials/``.
"""

from __future__ import annotations

#: (what the cell makes, the cell's source); each cell shows one explorer
CELLS = [
    ("ClippingExplorer", "ClippingExplorer(toy=make_toy())"),
    ("NoiseExplorer", "NoiseExplorer(toy=make_toy())"),
    ("PrivacyBudgetExplorer", 'PrivacyBudgetExplorer(accountant="rdp")'),
    ("AugmultExplorer", "AugmultExplorer()"),
    ("TrainingMonitor",
     "monitor = TrainingMonitor(total_steps=4, progress=False)\n"
     "for step in (1, 2):\n"
     "    monitor.update(step=step, loss=1.0 / step, accuracy=0.3 * step, epsilon=0.1 * step, clip_fraction=0.5)\n"
     "monitor"),
    ("GradientExplorer",
     "torch.manual_seed(0)\n"
     "GradientExplorer(nn.Linear(3, 2), (torch.randn(4, 3), torch.randint(0, 2, (4,))),\n"
     "                 nn.functional.cross_entropy)"),
]
IMPORTS = (
    "import torch\n"
    "from torch import nn\n"
    "from dpnotebook.widgets import (AugmultExplorer, ClippingExplorer, GradientExplorer, NoiseExplorer,\n"
    "                                PrivacyBudgetExplorer, TrainingMonitor, make_toy)\n"
    "from dpnotebook.widgets._figure import ipympl_active\n"
)
#: the cell whose slider the checks move
SLIDER_CELL = "ClippingExplorer("


def explorer_notebook(setup: str) -> dict:
    """An nbformat-4 notebook: the ``setup`` cell, then one cell per explorer of :data:`CELLS`."""

    def code(source: str) -> dict:
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}

    return {
        "cells": [code(setup)] + [code(source) for _, source in CELLS],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def explorer_cell_indices(nb: dict) -> dict[str, int]:
    """``{explorer name: index of its cell}`` in ``nb`` (a notebook made by :func:`explorer_notebook`)."""
    cells = {}
    for name, source in CELLS:
        first = source.splitlines()[0]
        cells[name] = next(i for i, cell in enumerate(nb["cells"]) if "".join(cell["source"]).startswith(first))
    return cells
