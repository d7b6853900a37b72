"""Every advantage estimator of rlweave.algo_parts against values computed by hand in fp64:
ragged masks, a group of identical non-binary rewards (exactly 0), a singleton group and a
sample with no trained token."""

from __future__ import annotations

import statistics

import pytest
import torch

from rlweave.algo_parts import advantages as A
from rlweave.algo_parts.stats import group_standardize, masked_whiten

# six samples: group 0 = samples 0-2 (rewards 1, 0, 0.5), group 1 = samples 3-4 (3.3, 3.3:
# equal, non-binary), group 2 = sample 5 alone; sample 2 has no trained token
MASKS = [[0, 1, 1], [0, 1, 1, 1], [0, 0], [0, 1], [0, 1, 1], [0, 1, 1]]
SCORES = [1.0, 0.0, 0.5, 3.3, 3.3, 2.0]
GROUPS = [0, 0, 0, 1, 1, 2]
EPS = 1e-6


def inputs(**extra):
    lens = [len(m) for m in MASKS]
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))])
    return dict(scores=torch.tensor(SCORES, dtype=torch.float64), groups=torch.tensor(GROUPS),
                mask=torch.tensor([x for m in MASKS for x in m], dtype=torch.float32), cu_seqlens=cu,
                token_rewards=None, values=None, baseline=None, **extra)


def spread(per_sample):
    """Per-sample values on each sample's trained tokens, as the estimators lay them out."""
    return [v * x for v, m in zip(per_sample, MASKS) for x in m]


def test_grpo_divides_by_the_sample_std_and_equal_or_single_groups_give_zero():
    adv, ret = A.grpo(**inputs())
    s = statistics.stdev([1.0, 0.0, 0.5])  # 0.5
    a = 0.5 / (s + EPS)
    assert ret is None
    assert adv.tolist() == pytest.approx(spread([a, -a, 0.0, 0.0, 0.0, 0.0]), abs=1e-6)
    assert adv[7:].abs().sum().item() == 0.0  # group 1 (3.3, 3.3) and the singleton: exactly 0


def test_identical_non_binary_rewards_give_exactly_zero():
    for value in (3.3, 0.1, 1e-3, 7.77):
        r = torch.full((32,), value, dtype=torch.float32)
        g = torch.zeros(32, dtype=torch.long)
        assert torch.count_nonzero(group_standardize(r, g)).item() == 0, value
        cu = torch.arange(33) * 2
        mask = torch.tensor([0.0, 1.0] * 32)
        for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
            adv, _ = getattr(A, name)(scores=r, groups=g, mask=mask, cu_seqlens=cu)
            assert torch.count_nonzero(adv).item() == 0, (name, value)


def test_dr_grpo_centres_without_dividing():
    adv, _ = A.dr_grpo(**inputs())
    assert adv.tolist() == pytest.approx(spread([0.5, -0.5, 0.0, 0.0, 0.0, 0.0]), abs=1e-7)


def test_rloo_subtracts_the_mean_of_the_others():
    adv, _ = A.rloo(**inputs())
    # sample 0: 1 - mean(0, 0.5) = 0.75; sample 1: 0 - mean(1, 0.5) = -0.75; sample 2: 0.5 - 0.5
    assert adv.tolist() == pytest.approx(spread([0.75, -0.75, 0.0, 0.0, 0.0, 0.0]), abs=1e-7)


def test_reinforce_pp_whitens_the_return_to_go_over_the_batch():
    adv, ret = A.reinforce_pp(**inputs())
    # gamma 1, no KL: every trained token's return is its sample's score
    expect_ret = spread(SCORES)
    assert ret.tolist() == pytest.approx(expect_ret, abs=1e-6)
    on = [r for r, m in zip(expect_ret, [x for m in MASKS for x in m]) if m]
    mu, sd = statistics.fmean(on), statistics.stdev(on)
    want = [((r - mu) / (sd + EPS)) if m else 0.0 for r, m in zip(expect_ret, [x for m in MASKS for x in m])]
    assert adv.tolist() == pytest.approx(want, abs=1e-6)


def test_reinforce_pp_discounts_token_rewards():
    # one sample, prompt token then 2 response tokens, KL penalties -0.1 and -0.2, score 1, gamma 0.5:
    # r = [-0.1, -0.2 + 1.0]; G = [-0.1 + 0.5 * 0.8, 0.8] = [0.3, 0.8]
    _, ret = A.reinforce_pp(scores=torch.tensor([1.0]), mask=torch.tensor([0.0, 1.0, 1.0]),
                            cu_seqlens=torch.tensor([0, 3]), token_rewards=torch.tensor([9.0, -0.1, -0.2]),
                            gamma=0.5)
    assert ret.tolist() == pytest.approx([0.0, 0.3, 0.8], abs=1e-6)


def test_sequence_estimators_sum_the_token_rewards_into_the_score():
    tr = torch.zeros(sum(len(m) for m in MASKS))
    tr[1] = -0.25  # sample 0, a trained token
    tr[0] = -5.0   # a prompt token: not counted
    adv, _ = A.dr_grpo(**{**inputs(), "token_rewards": tr})
    # group 0 totals 0.75, 0, 0.5 -> mean 5/12
    m = 1.25 / 3
    assert adv.tolist() == pytest.approx(spread([0.75 - m, -m, 0.5 - m, 0.0, 0.0, 0.0]), abs=1e-6)


def test_reinforce_pp_baseline_centres_in_groups_then_whitens():
    adv, _ = A.reinforce_pp_baseline(**inputs())
    flat_mask = [x for m in MASKS for x in m]
    centred = spread([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    on = [c for c, m in zip(centred, flat_mask) if m]
    mu, sd = statistics.fmean(on), statistics.stdev(on)
    assert adv.tolist() == pytest.approx([(c - mu) / (sd + EPS) if m else 0.0 for c, m in zip(centred, flat_mask)],
                                         abs=1e-6)
    # the batch's token mean is not 0 (responses differ in length), so the singleton (sample 5) and the
    # equal-reward group (samples 3, 4) get -mean/std on each token, not 0, as in verl
    assert mu == pytest.approx(-0.05)
    assert adv[-1].item() == pytest.approx(-mu / (sd + EPS), abs=1e-6) and adv[-1].item() > 0.05


def test_remax_subtracts_the_greedy_reward():
    base = torch.tensor([0.5, 0.5, 0.5, 3.0, 3.0, 1.0])
    adv, _ = A.remax(**{**inputs(), "baseline": base})
    assert adv.tolist() == pytest.approx(spread([0.5, -0.5, 0.0, 0.3, 0.3, 1.0]), abs=1e-6)
    with pytest.raises(ValueError, match="greedy"):
        A.remax(**inputs())


def test_gae_matches_the_recursion_by_hand():
    gamma, lam = 0.9, 0.8
    values = [7.0, 0.5, 0.2, 0.1]  # token 0 is the prompt
    kl = [-0.1, -0.1, -0.1]
    r = [kl[0], kl[1], kl[2] + 1.0]
    v = values[1:] + [0.0]
    a, adv_by_hand = 0.0, []
    for t in (2, 1, 0):
        a = r[t] + gamma * v[t + 1] - v[t] + gamma * lam * a
        adv_by_hand.insert(0, a)
    adv, ret = A.gae(scores=torch.tensor([1.0]), mask=torch.tensor([0.0, 1, 1, 1]), cu_seqlens=torch.tensor([0, 4]),
                     token_rewards=torch.tensor([0.0] + kl), values=torch.tensor(values), gamma=gamma, lam=lam)
    assert adv.tolist() == pytest.approx([0.0] + adv_by_hand, abs=1e-6)
    assert ret.tolist() == pytest.approx([0.0] + [x + y for x, y in zip(adv_by_hand, values[1:])], abs=1e-6)
    with pytest.raises(ValueError, match="critic"):
        A.gae(**inputs())


def test_estimators_leave_untrained_tokens_and_fully_masked_samples_at_zero():
    flat_mask = torch.tensor([x for m in MASKS for x in m])
    base = torch.tensor(SCORES)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"):
        adv, _ = getattr(A, name)(**{**inputs(), "baseline": base * 0.5})
        assert adv.dtype == torch.float32
        assert adv[flat_mask == 0].abs().sum().item() == 0.0, name


def test_masked_whiten_uses_the_sample_std_in_float64():
    x = torch.tensor([1.0, 2.0, 100.0, 3.0], dtype=torch.float32)
    m = torch.tensor([1.0, 1.0, 0.0, 1.0])
    sd = statistics.stdev([1.0, 2.0, 3.0])
    assert masked_whiten(x, m).tolist() == pytest.approx([-1 / (sd + EPS), 0.0, 0.0, 1 / (sd + EPS)], abs=1e-6)
    assert masked_whiten(torch.full((4,), 3.3), m).abs().sum().item() == 0.0
