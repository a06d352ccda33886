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
    ("PrivacyAttackExplorer", "PrivacyAttackExplorer()"),
    (
        "TrainingMonitor",
        "monitor = TrainingMonitor(total_steps=4, progress=False)\n"
        "for step in (1, 2):\n"
        "    monitor.update(step=step, loss=1.0 / step, accuracy=0.3 * step, epsilon=0.1 * step, clip_fraction=0.5)\n"
        "monitor",
    ),
    (
        "GradientExplorer",
        "torch.manual_seed(0)\n"
        "GradientExplorer(nn.Linear(3, 2), (torch.randn(4, 3), torch.randint(0, 2, (4,))),\n"
        "                 nn.functional.cross_entropy)",
    ),
]
IMPORTS = (
    "import torch\n"
    "from torch import nn\n"
    "from dpnotebook.widgets import (AugmultExplorer, ClippingExplorer, GradientExplorer, NoiseExplorer,\n"
    "                                PrivacyAttackExplorer, PrivacyBudgetExplorer, TrainingMonitor, make_toy)\n"
    "from dpnotebook.widgets._figure import ipympl_active\n"
)
#: JavaScript ``i => [...]``: the figures (``img`` or ipympl canvas) of cell ``i``'s output, each with its
#: kind, size on the page, size in pixels, distinct colours (up to 64) and inked (non-white) pixels
FIGURES_JS = r"""
i => {
  const cell = window.__dpnb.panel.content.widgets[i];
  const root = cell.outputArea.node;
  const stats = (el, source, w, h) => {
    const b = el.getBoundingClientRect();
    let colours = 0, inked = 0;
    if (w > 0 && h > 0) {
      let data;
      if (source.tagName === 'CANVAS') {
        data = source.getContext('2d').getImageData(0, 0, w, h).data;
      } else {
        const c = document.createElement('canvas');
        c.width = w; c.height = h;
        const ctx = c.getContext('2d');
        ctx.drawImage(source, 0, 0);
        data = ctx.getImageData(0, 0, w, h).data;
      }
      const seen = new Set();
      for (let k = 0; k < data.length; k += 4) {
        const rgba = (data[k] << 24) | (data[k + 1] << 16) | (data[k + 2] << 8) | data[k + 3];
        if (seen.size < 64) seen.add(rgba);
        if (data[k + 3] > 0 && (data[k] < 200 || data[k + 1] < 200 || data[k + 2] < 200)) inked += 1;
      }
      colours = seen.size;
    }
    return {width: b.width, height: b.height, pixelWidth: w, pixelHeight: h, colours, inked};
  };
  const imgs = Array.from(root.querySelectorAll('img')).map(img =>
    Object.assign({kind: 'img', loaded: img.complete && img.naturalWidth > 0},
                  stats(img, img, img.complete ? img.naturalWidth : 0, img.complete ? img.naturalHeight : 0)));
  const canvases = Array.from(root.querySelectorAll('.jupyter-matplotlib-canvas-div')).map(div => {
    const c = div.querySelector('canvas');
    return Object.assign({kind: 'canvas'}, stats(div, c, c ? c.width : 0, c ? c.height : 0));
  });
  return imgs.concat(canvases);
}
"""
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


def figure_problem(label: str, figure: dict) -> str | None:
    """What is wrong with one probed figure (of :data:`FIGURES_JS`): zero size, or blank; ``None`` if drawn."""
    if min(figure["width"], figure["height"], figure["pixelWidth"], figure["pixelHeight"]) < 1:
        return f"{label} of zero size {figure}"
    if figure["colours"] < 3 or figure["inked"] < 100:
        return f"{label} blank {figure}"
    return None
