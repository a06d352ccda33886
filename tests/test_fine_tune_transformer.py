"""The transformer fine-tuning example on tiny settings: its printed claims hold."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

# runs the example three times (about 20 s on 2 cores): the quick loop leaves it out, as the digits example
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fine_tune_transformer.py"
TINY = ["--public-size", "300", "--private-size", "200", "--length", "8", "--width", "16", "--layers", "1",
        "--pretrain-epochs", "3", "--epochs", "5", "--batch-size", "32", "--lr", "2e-2", "--no-progress"]  # fmt: skip


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fine_tune_transformer", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["ghost", "hooks", "functorch"])
def test_fine_tune_transformer_prints_what_it_measured(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    pytest.importorskip("transformers")
    import torch

    threads = torch.get_num_threads()
    try:
        result = load_example().main([*TINY, "--grad-sample-mode", mode])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert 7.5 < result["epsilon"] <= 8.0 and result["delta"] == 1e-5  # the default target, spent
    assert result["perplexity_dp"] < result["perplexity_before"] / 1.5  # the private text became much likelier
    assert result["perplexity_non_private"] < result["perplexity_before"] / 1.5
    assert result["trained_parameters"] == 4 * ((16 + 48) + (16 + 16) + (16 + 64) + (64 + 16))  # rank 4, 4 layers
    assert result["steps"] == 5 * 7  # 5 epochs of ceil(200 / 32) Poisson batches
    assert result["step_ms_dp"] > 0 and result["step_ms_non_private"] > 0
    printed = {k: float(v) for k, v in re.findall(r"(before|non-private fine-tune|DP fine-tune) ([\d.]+)", out)}
    assert printed == pytest.approx(
        {"before": result["perplexity_before"], "non-private fine-tune": result["perplexity_non_private"],
         "DP fine-tune": result["perplexity_dp"]}, rel=0.01)  # fmt: skip
    assert f"epsilon = {result['epsilon']:.2f} at delta = 1e-05" in out
    assert f"trained parameters: {result['trained_parameters']} of {result['total_parameters']}" in out
    assert f"DP ({mode})" in out
