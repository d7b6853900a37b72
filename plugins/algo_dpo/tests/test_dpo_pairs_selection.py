"""OnlineDPO pair formation: best vs worst, ties never used, tied prompts counted."""

from __future__ import annotations

import pytest

from rlweave_algo_dpo.selection import select_pairs


def test_best_vs_worst_and_ties_counted():
    rewards = [
        [0.0, 1.0, 0.5, 1.0],   # best: first 1.0 (k=1), worst k=0
        [1.0, 1.0, 1.0, 1.0],   # all tie -> counted, no pair
        [0.0, 0.0, 0.0, 0.0],   # all tie (all wrong) -> counted
        [0.2, -1.0, 0.3, -1.0],  # best k=2, worst first -1.0 (k=1)
    ]
    sel = select_pairs(rewards)
    assert sel.pairs == [(0, 1, 0), (3, 2, 1)]
    assert sel.tied == [1, 2]
    assert sel.too_few == []
    for i, b, w in sel.pairs:
        assert rewards[i][b] > rewards[i][w]


def test_identical_rewards_never_paired_and_gap():
    # every sample identical within each prompt: no pair at all, every prompt counted
    sel = select_pairs([[0.5, 0.5], [0.25, 0.25, 0.25]])
    assert sel.pairs == [] and sel.tied == [0, 1]
    # a gap threshold turns small differences into ties too
    sel = select_pairs([[0.0, 0.05], [0.0, 1.0]], min_reward_gap=0.1)
    assert sel.pairs == [(1, 1, 0)] and sel.tied == [0]
    with pytest.raises(ValueError):
        select_pairs([[0.0, 1.0]], min_reward_gap=-1)


def test_unusable_samples_excluded():
    rewards = [[1.0, 0.0, 0.5], [1.0, 0.0]]
    usable = [[False, True, True], [True, False]]
    sel = select_pairs(rewards, usable)
    assert sel.pairs == [(0, 2, 1)]  # the failed best sample k=0 is skipped
    assert sel.too_few == [1]
    assert sel.tied == []


def test_every_prompt_accounted_for():
    import random

    rng = random.Random(0)
    rewards = [[float(rng.randint(0, 2)) for _ in range(4)] for _ in range(200)]
    sel = select_pairs(rewards)
    seen = [i for i, _, _ in sel.pairs] + sel.tied + sel.too_few
    assert sorted(seen) == list(range(200))
    assert all(len(set(rs)) == 1 for i, rs in enumerate(rewards) if i in sel.tied)
