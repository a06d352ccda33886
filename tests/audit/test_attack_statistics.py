"""Error bars on an attack: exact intervals on its rates, a held-out threshold, a noise floor for its advantage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from dpnotebook.audit import advantage_noise_floor, attack_roc, clopper_pearson, held_out_point


@pytest.mark.parametrize("p, n", [(0.01, 500), (0.1, 500), (0.5, 40), (0.9, 200)])
def test_clopper_pearson_covers_the_rate_at_least_as_often_as_promised(p, n):
    k = np.arange(n + 1)
    covered = np.array([lo <= p <= hi for lo, hi in (clopper_pearson(int(i), n) for i in k)])
    assert float(binom.pmf(k, n, p)[covered].sum()) >= 0.95


def test_clopper_pearson_refuses_bad_counts():
    with pytest.raises(ValueError, match="trials"):
        clopper_pearson(0, 0)
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(6, 5)
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 5, confidence=1.0)


def test_noise_floor_is_the_kolmogorov_smirnov_quantile():
    rng = np.random.default_rng(3)
    floor = advantage_noise_floor(rng.standard_normal(500), rng.standard_normal(500), permutations=2000, seed=1)
    ks = math.sqrt(-math.log(0.05) * (1 / 500 + 1 / 500) / 2)  # one-sided, asymptotic: 0.077
    assert abs(floor - ks) < 0.006
    # it does not depend on the signal: a real difference is relabelled away
    assert advantage_noise_floor(rng.standard_normal(500) + 3, rng.standard_normal(500), permutations=300) < 0.1
    # the best threshold on pure noise reaches it about 5% of the time
    reached = [attack_roc(rng.standard_normal(500), rng.standard_normal(500)).advantage > floor for _ in range(400)]
    assert 0.02 < np.mean(reached) < 0.09
    with pytest.raises(ValueError, match="permutations"):
        advantage_noise_floor([1.0], [2.0], permutations=0)


def test_held_out_point_intervals_cover_the_true_rates():
    rng = np.random.default_rng(5)
    missed = 0
    for seed in range(100):
        members, others = rng.standard_normal(400) + 1.0, rng.standard_normal(400)
        point = held_out_point(members, others, target_fpr=0.1, seed=seed)
        true_tpr, true_fpr = norm.sf(point.threshold - 1.0), norm.sf(point.threshold)
        inside = point.tpr_interval[0] <= true_tpr <= point.tpr_interval[1]
        inside &= point.fpr_interval[0] <= true_fpr <= point.fpr_interval[1]
        missed += not inside
    assert missed <= 10  # promised: at most 5% jointly (binomial slack)
    assert "jointly" in str(point) and point.members == 200


def test_held_out_point_refuses_too_few_scores():
    with pytest.raises(ValueError, match="at least 2"):
        held_out_point([1.0], [0.0, 1.0], target_fpr=0.1)
    with pytest.raises(ValueError, match="target_fpr"):
        held_out_point([1.0, 2.0], [0.0, 1.0], target_fpr=1.5)
