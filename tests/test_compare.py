"""compare_modes reports agreement with the oracle, and refusals instead of crashing."""

import torch
from torch import nn

from dpnotebook.compare import compare_modes
from dpnotebook.modes import available_modes


def test_modes_agree_on_a_small_cnn_with_k() -> None:
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))
    x, y = torch.randn(6, 1, 6, 6), torch.randint(0, 4, (6,))
    rows = compare_modes(model, x, y, K=2, repeats=1)
    assert [r.mode for r in rows] == ["oracle", *available_modes()]
    assert all(r.agrees and r.max_error < 1e-5 for r in rows)


def test_a_refusing_mode_is_reported_not_raised() -> None:
    model = nn.Sequential(nn.EmbeddingBag(10, 4), nn.Linear(4, 2))
    x, y = torch.randint(0, 10, (4, 3)), torch.randint(0, 2, (4,))
    rows = {r.mode: r for r in compare_modes(model, x, y, repeats=1)}
    assert not rows["ew"].agrees and "embedding_bag" in rows["ew"].error
    assert rows["hooks"].agrees


def test_a_wrong_result_is_not_called_agreement() -> None:
    model = nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    rows = {r.mode: r for r in compare_modes(model, x, y, repeats=1, tolerance=-1.0)}
    assert not rows["hooks"].agrees  # nothing can be within a negative tolerance
