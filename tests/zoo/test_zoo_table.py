"""``python -m dpnotebook.benchmarks.zoo_table`` runs on the smallest settings and prints every mode (no timing is
asserted); the snippets of ``docs/real-models.md`` run as they are."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import dpnotebook
from dpnotebook.benchmarks.zoo import ZOO, build
from dpnotebook.benchmarks.zoo_table import main, zoo_table
from tests.test_doc_snippets import ROOT, snippets


def test_cli_prints_a_row_per_mode_and_opacus_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--models", "resnet", "--steps", "1", "--warmup", "0", "--batch", "2", "--opacus"]) == 0
    out = capsys.readouterr().out
    for mode in dpnotebook.available_modes():  # ResNet runs in every mode: error, no fallback in the layer-wise ones
        assert re.search(rf"^resnet +{mode} +\d\.\de-\d\d  \d+( whole)? +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M), out
    assert re.search(r"^resnet +x[\d.]+ \((hooks|functorch|ew|ghost)\)", out, re.M), out
    assert "B=2, median of 1 timed pairs" in out


def test_table_shows_refusals_and_whole_model_units() -> None:
    rows = [
        {
            "model": "vit",
            "mode": "hooks",
            "err": 1e-7,
            "fallback": 1,
            "whole": True,
            "dp_ms": 2.0,
            "plain_ms": 1.0,
            "ratio": 2.0,
            "opacus": "",
        },
        {"model": "bert", "mode": "ew", "refused": "GradSampleError: use 'functorch'", "opacus": ""},
    ]
    table = zoo_table(rows)
    assert re.search(r"^vit +hooks +1\.0e-07  1 whole +2\.0 +1\.0 +2\.00$", table, re.M), table
    assert "bert       ew        refused: GradSampleError: use 'functorch'" in table
    assert "Opacus" not in table


def test_bad_arguments_are_refused_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--batch", "0"])
    assert "--batch=0 --steps=20 --warmup=2: use batch, steps >= 1, warmup >= 0." in capsys.readouterr().err
    with pytest.raises(
        ValueError, match=re.escape(f"model='resnet18' is not in the zoo; choose one of {sorted(ZOO)}.")
    ):
        build("resnet18")


@pytest.mark.parametrize("heading", ["The model zoo", "Adding support for a new layer", "A channels-first LayerNorm"])
def test_the_real_models_page_snippets_run(heading: str) -> None:
    code = snippets("docs/real-models.md")[heading]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, f"docs/real-models.md section {heading!r} fails:\n{done.stderr[-3000:]}"
    if heading == "The model zoo":
        assert str(sorted(ZOO)) in done.stdout
    elif heading == "A channels-first LayerNorm":  # the checker's table: the registered sampler, then torch.func
        assert "registered sampler (channels_first_layer_norm_grad_sampler)" in done.stdout, done.stdout
    else:  # the checker's table, then the new layer's sampler among the units
        assert "registered sampler (channel_scale_grad_sampler)" in done.stdout
        assert "('model.1', 'channel_scale_grad_sampler')" in done.stdout
