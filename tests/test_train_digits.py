"""The end-to-end example: DP-SGD on the digits reaches >= 85% test accuracy at epsilon <= 8."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # trains the digits example end to end (30 epochs)
def test_train_digits_reaches_85_percent_at_epsilon_8(capsys):
    pytest.importorskip("sklearn")
    import torch

    threads = torch.get_num_threads()
    try:
        result = load_example().main(["--no-progress"])
    finally:
        torch.set_num_threads(threads)
    assert result["epsilon"] <= 8.0
    assert result["accuracy"] >= 0.85
    assert result["baseline_accuracy"] >= result["accuracy"] - 0.05
    assert result["steps"] == 30 * 12
    out = capsys.readouterr().out
    assert "non-private" in out and "DP-SGD" in out and "epsilon = " in out
