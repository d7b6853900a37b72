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


def test_pairs_from_sampled_trajectories_keep_their_loss_mask():
    """OnlineDPO pairs cut from a rollout batch: an episode's observation tokens stay untrained,
    and the layout is build_pair_batch's (chosen, rejected side by side, weights per pair)."""
    import torch
    from rlweave.data.batch import Batch

    from rlweave_algo_dpo.pairs import build_pair_batch, select_pair_batch

    samples = Batch.from_sequences([[1, 2, 3], [1, 4, 5, 6, 7], [8, 9], [8, 10, 11]], ids=["a/0", "a/1", "b/0", "b/1"],
                                   meta=[{"answer": k} for k in range(4)], prompt_lens=[1, 1, 1, 1])
    samples.token["loss_mask"][5] = 0.0  # token 5 of "a/1": an observation between two model turns
    pairs = select_pair_batch(samples, [(1, 0), (2, 3)], ["a", "b"])
    assert pairs.ids == ["a/chosen", "a/rejected", "b/chosen", "b/rejected"]
    assert [m["answer"] for m in pairs.meta] == [1, 0, 2, 3] and pairs.meta[0]["side"] == "chosen"
    assert [s.tolist() for s in pairs.sequences()] == [[1, 4, 5, 6, 7], [1, 2, 3], [8, 9], [8, 10, 11]]
    assert pairs.token["loss_mask"].tolist() == [0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1, 1]
    plain = build_pair_batch([[1], [8]], [[4, 5, 6, 7], [9]], [[2, 3], [10, 11]], ["a", "b"])
    for key in ("pair_id", "group", "is_chosen", "pair_weight"):
        assert torch.equal(pairs.sample[key], plain.sample[key]), key
    chosen = pairs.token["sft_weight"] > 0
    assert chosen.tolist() == [False, True, False, True, True] + [False] * 3 + [False, True] + [False] * 3
    assert torch.isclose(pairs.token["sft_weight"].sum(), torch.tensor(1.0))


def test_an_agents_extra_samples_and_failed_episodes_are_not_paired():
    """Candidates per record come from the batch's ``group`` field (a record may hold more than
    ``n_samples`` samples: an agent's reset starts one with another prompt); only samples that
    start from the record's most common prompt and have a final answer may be paired."""
    import torch
    from rlweave.data.batch import Batch

    from rlweave_algo_dpo.pairs import record_candidates

    seqs = [[1, 2, 3], [1, 4, 5], [7, 8, 9], [1, 6], [2, 5], [2, 6], [1, 7]]
    answers = [[3], [5], [9], [], [5], [6], [7]]  # sample 3: a failed episode (no final answer)
    samples = Batch.from_sequences(seqs, ids=[f"s{i}" for i in range(7)], prompt_lens=[1, 1, 2, 1, 1, 1, 1],
                                   meta=[{"response_ids": a} for a in answers])
    samples.add_sample("group", torch.tensor([0, 0, 0, 0, 1, 1, 0]))
    members, usable = record_candidates(samples, 2)
    assert members == [[0, 1, 2, 3, 6], [4, 5]]
    assert usable == [[True, True, False, False, True], [True, True]]
    samples.sample["group"] = torch.tensor([0] * 7)
    with pytest.raises(RuntimeError, match=r"no sample for records \[1\]"):
        record_candidates(samples, 2)
