"""What every explorer promises: no new figures when sliders move, a static picture, a live caption."""

from __future__ import annotations

import base64
import html

import matplotlib.pyplot as plt
import pytest

from dpnotebook import widgets as w


def _builders():
    return {
        "gradient": lambda b, mb: w.GradientExplorer(*mb, backend=b),
        "clipping": lambda b, mb: w.ClippingExplorer(toy=w.make_toy(16), backend=b),
        "noise": lambda b, mb: w.NoiseExplorer(toy=w.make_toy(32), backend=b),
        "budget": lambda b, mb: w.PrivacyBudgetExplorer(
            accountant="rdp", epochs=2, points=2, batch_size=100, dataset_size=10_000, backend=b
        ),
        "augmult": lambda b, mb: w.AugmultExplorer(k_max=3, backend=b),
        "monitor": lambda b, mb: w.TrainingMonitor(redraw_every=0, progress=False, backend=b),
        "attack": lambda b, mb: w.PrivacyAttackExplorer(backend=b),
    }


MOVES = {
    "gradient": [("sample", 1), ("sample", 2), ("sample", 3)],
    "clipping": [("max_grad_norm", 0.1), ("max_grad_norm", 0.3), ("clipping", "per_layer")],
    "noise": [("noise_multiplier", 0.5), ("batch_size", 8), ("max_grad_norm", 0.5)],
    "budget": [("epochs", 1), ("epochs", 2), ("epochs", 1)],
    "augmult": [("K", 2), ("K", 3), ("max_grad_norm", 0.5)],
    "monitor": [],
    "attack": [("threshold", 0.8), ("noise_multiplier", 2.0), ("selected", "sigma = 2")],
}


@pytest.mark.parametrize("name", list(MOVES))
@pytest.mark.parametrize("backend", ["image", "ipympl"])
def test_figure_count_constant_and_picture_updates(name, backend, small_model_batch):
    before = plt.get_fignums()
    ex = _builders()[name](backend, small_model_batch)
    fig = ex.figure
    for trait, value in MOVES[name]:
        ex.controls[trait].value = value
        assert ex.error.message == "", ex.error.message
    if name == "monitor":
        for step in range(1, 4):
            ex.update(step=step, loss=1.0 / step)
    assert ex.figure is fig
    assert plt.get_fignums() == before
    if backend == "image":
        assert bytes(ex.host.view.value).startswith(b"\x89PNG")


@pytest.mark.parametrize("name", [n for n in MOVES if n not in ("monitor", "gradient")])
def test_caption_live_label_in_static_picture(name, small_model_batch):
    ex = _builders()[name]("image", small_model_batch)
    assert not ex.label.get_visible()  # live: the caption shows it
    assert html.escape(ex.label.get_text()) in ex.caption.value
    ex.controls[MOVES[name][0][0]].value = MOVES[name][0][1]
    assert html.escape(ex.label.get_text()) in ex.caption.value
    live = bytes(ex.host.view.value)
    static = ex._repr_png_()
    assert static != live  # the static picture has the label
    assert not ex.label.get_visible()
    bundle = ex._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]) == static
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_widget_box_holds_controls_caption_figure_errors(small_model_batch):
    ex = _builders()["clipping"]("image", small_model_batch)
    controls, caption, view, error = ex.widget.children
    assert set(controls.children) >= set(ex.controls.values())
    assert caption is ex.caption and view is ex.host.view and error is ex.error.view
