"""Claims the teaching material makes, checked against the maths and the library.

Each test holds one statement of ``docs/concepts/`` or a tutorial true: the neighbouring relation the
accountants assume (add/remove: the clipped sum moves by at most ``C``; replacing a record moves it by
up to ``2C``), the ``mu`` of one DP-SGD step (``1 / sigma``, not ``C / sigma``), what the one-run audit can
show with 1000 canaries, and which inequality an attack refutes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from dpnotebook.audit import gaussian_tpr, one_run_epsilon, pld_tpr
from dpnotebook.exercises._tutorial_08 import _refuted
from dpnotebook.privacy import clip_and_sum

ROOT = Path(__file__).resolve().parents[1]
ACCOUNTING = ROOT / "docs" / "concepts" / "accounting.md"


def _prose(notebook: str) -> str:
    cells = json.loads((ROOT / "tutorials" / notebook).read_text(encoding="utf-8"))["cells"]
    return " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").replace("\n", " ")


def test_add_remove_moves_the_clipped_sum_by_c_and_replace_by_2c() -> None:
    C = 1.0
    kept, removed, replacement = torch.tensor([[0.3, 0.4]]), torch.tensor([[5.0, 0.0]]), torch.tensor([[-5.0, 0.0]])

    def total(*rows: torch.Tensor) -> torch.Tensor:
        return clip_and_sum([torch.cat(rows)], max_grad_norm=C).summed[0]

    assert math.isclose(float((total(kept, removed) - total(kept)).norm()), C, rel_tol=1e-5)  # add/remove: C
    assert math.isclose(float((total(kept, removed) - total(kept, replacement)).norm()), 2 * C, rel_tol=1e-5)


def test_the_accounting_page_names_add_remove_neighbours() -> None:
    definition = ACCOUNTING.read_text(encoding="utf-8").split("## Composing steps")[0]
    assert "adding or removing one sample" in definition  # the relation the accountants' epsilon is for
    assert "2C" in definition  # and what replacing a sample costs instead


def test_mu_of_one_dp_sgd_step_is_one_over_sigma() -> None:
    fpr = np.array([0.01, 0.1, 0.5])
    one_step = pld_tpr(fpr, noise_multiplier=2.0, sample_rate=1.0, steps=1)
    assert np.allclose(one_step, gaussian_tpr(fpr, 0.5), atol=5e-3)  # mu = Delta / (sigma C) = 1 / sigma
    assert r"\mu = \Delta / \sigma$" not in ACCOUNTING.read_text(encoding="utf-8")  # sigma is the multiplier there


def test_the_one_run_ceiling_is_that_of_600_guesses_not_of_1000_canaries() -> None:
    ceiling = one_run_epsilon(canaries=1000, guesses=600, correct=600, delta=1e-5, significance=0.05 / 12)
    every_canary = one_run_epsilon(canaries=1000, guesses=1000, correct=1000, delta=1e-5, significance=0.05 / 12)
    assert abs(ceiling - 4.57) < 0.01 and every_canary > ceiling + 0.4
    assert "the most that 1000 canaries can show" not in _prose("08_what_epsilon_means.ipynb")


def test_both_inequalities_refute_the_attack_that_calls_everyone_a_member() -> None:
    first_only = _refuted(500, 500, 300, 500, 1e-5, corners="first")
    assert 0.4 < first_only < _refuted(500, 500, 300, 500, 1e-5) - 3  # the second refutes far more
    assert "only the second inequality catches" not in _prose("08_what_epsilon_means.ipynb")
