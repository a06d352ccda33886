"""Empirical lower bounds are sound for any input: any order of the canaries, any ties (issue #28.6).

The one-run bound assumes every guess is a function of the scores (the training run's output).
Before, ties were broken by position, so canaries listed members first with equal scores gave
"epsilon >= 4.57 with probability 95 %" where the true epsilon is 0. Now a tie that straddles a cut is
counted at its worst (the guesses land on the wrong canaries first); these tests feed adversarial
orderings, ties and constant scores.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnotebook.audit import attack_roc, audit_one_run

# few distinct values: ties everywhere; booleans: the coins
canary_sets = st.integers(min_value=2, max_value=60).flatmap(
    lambda m: st.tuples(
        st.lists(st.integers(min_value=-2, max_value=2), min_size=m, max_size=m),
        st.lists(st.booleans(), min_size=m, max_size=m),
        st.permutations(list(range(m))),
    )
)


def test_information_free_canaries_listed_members_first_refute_nothing() -> None:
    # issue #28.6's figure: 1,000 equal scores, the 500 members first: 4.57 before
    included = np.arange(1000) < 500
    audit = audit_one_run(np.zeros(1000), included, delta=1e-5)
    assert audit.epsilon == 0.0


@settings(max_examples=60, deadline=None)
@given(canary_sets)
def test_one_run_bound_ignores_the_order_of_the_canaries(data) -> None:
    scores, included, order = np.array(data[0], dtype=float), np.array(data[1]), np.array(data[2])
    a = audit_one_run(scores, included, delta=1e-5)
    b = audit_one_run(scores[order], included[order], delta=1e-5)
    assert a.epsilon == b.epsilon and a.correct == b.correct and a.guesses == b.guesses


@settings(max_examples=60, deadline=None)
@given(canary_sets)
def test_the_order_that_helps_position_tie_breaking_most_changes_nothing(data) -> None:
    scores, included = np.array(data[0], dtype=float), np.array(data[1])
    members_first = np.lexsort((~included, -scores))  # by score, members first within each tie
    members_last = np.lexsort((included, -scores))
    a = audit_one_run(scores[members_first], included[members_first])
    b = audit_one_run(scores[members_last], included[members_last])
    assert a.epsilon == b.epsilon


@settings(max_examples=12, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.floats(-1e6, 1e6))
def test_constant_scores_refute_epsilon_zero_with_probability_at_most_significance(m, value) -> None:
    # equal scores say nothing: the audit may refute epsilon = 0 only by the luck of the coins (all
    # heads, say), in at most 5 % of the 2^m equally likely coin outcomes. The bound depends on the
    # number of members alone (any order gives the same, see above), so the exact probability over
    # the coins is a sum over that number.
    from scipy.stats import binom

    refuted = 0.0
    for members in range(m + 1):
        included = np.arange(m) < members
        if audit_one_run(np.full(m, value), included).epsilon > 0:
            refuted += binom.pmf(members, m, 0.5)
    assert refuted <= 0.05


@settings(max_examples=60, deadline=None)
@given(canary_sets, st.data())
def test_the_count_is_at_most_what_any_tie_breaking_gets_right(data, more) -> None:
    from dpnotebook.audit import worst_case_correct

    scores, included = np.array(data[0], dtype=float), np.array(data[1])
    m = scores.size
    k_in = more.draw(st.integers(0, m))
    k_out = more.draw(st.integers(0, m - k_in))
    counted = worst_case_correct(scores, included, k_in, k_out)
    coins = np.random.default_rng(more.draw(st.integers(0, 2**32 - 1)))
    for _ in range(5):  # any tie-breaking: by position, after shuffling the canaries
        order = np.lexsort((coins.random(m), -scores))
        guessed_in, guessed_out = order[:k_in], order[m - k_out :] if k_out else order[:0]
        right = int(included[guessed_in].sum()) + int((~included[guessed_out]).sum())
        assert counted <= right
    # and it is reached: members last within each tie for "in", first for "out"
    worst_in = np.lexsort((included, -scores))[:k_in]
    rest = np.setdiff1d(np.arange(m), worst_in)
    worst_out = rest[np.lexsort((~included[rest], scores[rest]))][:k_out]
    assert counted == int(included[worst_in].sum()) + int((~included[worst_out]).sum())
    if len(np.unique(scores)) == m:  # no ties: the plain count
        ranks = np.argsort(np.argsort(-scores))
        assert counted == int(included[ranks < k_in].sum()) + int((~included[ranks >= m - k_out]).sum())


def test_at_most_significance_of_information_free_tied_audits_refute_epsilon_zero() -> None:
    # scores that know nothing (3 values, heavy ties), canaries listed so that position tie-breaking
    # would put the members first: a sound bound refutes epsilon = 0 in at most ~5 % of runs
    refuted = 0
    runs = 200
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        included = rng.random(200) < 0.5
        scores = rng.integers(0, 3, 200).astype(float)
        order = np.lexsort((~included, -scores))
        refuted += audit_one_run(scores[order], included[order]).epsilon > 0
    assert refuted <= 0.05 * runs + 3


@settings(max_examples=60, deadline=None)
@given(canary_sets)
def test_roc_ignores_order_and_counts_ties_together(data) -> None:
    scores, included, order = np.array(data[0], dtype=float), np.array(data[1]), np.array(data[2])
    if included.all() or not included.any():
        return
    a = attack_roc(scores[included], scores[~included])
    s, inc = scores[order], included[order]
    b = attack_roc(s[inc][::-1], s[~inc])
    assert a.auc == pytest.approx(b.auc) and a.advantage == pytest.approx(b.advantage)
    assert a.tpr_at(0.0) == b.tpr_at(0.0)
    flat = attack_roc(np.zeros(int(included.sum())), np.zeros(int((~included).sum())))
    assert flat.advantage == 0.0 and flat.auc == pytest.approx(0.5) and flat.tpr_at(0.0) == 0.0
