"""Group advantages (rlweave.algo_parts: grpo, dr_grpo and the group statistics) and overlong
shaping against hand-computed values."""

import math

import pytest
import torch

from rlweave.algo_parts.advantages import dr_grpo, grpo
from rlweave.algo_parts.stats import group_standardize, group_std
from rlweave_algo_grpo.shaping import overlong_penalty


def layout(n, resp=2):
    """``(mask, cu_seqlens)`` of ``n`` samples, each one prompt token then ``resp`` response tokens."""
    mask = torch.tensor(([0.0] + [1.0] * resp) * n)
    return mask, torch.arange(n + 1) * (resp + 1)


def per_token(values, resp=2):
    """Expected per-token advantages: 0 on each prompt token, the sample's value on its response."""
    return [x for v in values for x in [0.0] + [v] * resp]


def test_group_normalised_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    # group 0: mean 0.5, sample std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025; group 1 all equal, group 2 alone: 0
    a = 0.5 / math.sqrt(1 / 3)
    want = [a, -a, -a, a, 0.0, 0.0, 0.0]
    assert group_standardize(r, g, eps=0.0).tolist() == pytest.approx(want)
    # eps is added to the std
    assert group_standardize(r, g, eps=0.1)[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1))
    # the estimator broadcasts each sample's advantage to its response tokens, 0 on the prompt
    mask, cu = layout(7)
    adv, ret = grpo(scores=r, groups=g, mask=mask, cu_seqlens=cu, eps=0.0)
    assert ret is None and adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(per_token(want))


def test_groups_of_equal_rewards_give_exactly_zero():
    # 3.3 is not a binary fraction: a rounded mean must not turn into a large advantage
    r = torch.tensor([3.3, 3.3, 3.3, 0.7, 0.7])
    g = torch.tensor([0, 0, 0, 1, 1])
    assert group_standardize(r, g).tolist() == [0.0] * 5
    assert group_std(r, g).tolist() == [0.0] * 5
    mask, cu = layout(5)
    for fn in (grpo, dr_grpo):
        assert fn(scores=r, groups=g, mask=mask, cu_seqlens=cu)[0].tolist() == [0.0] * 15


def test_dr_grpo_skips_std_division_and_groups_need_not_be_sorted():
    r = torch.tensor([3.0, 1.0, 0.0, 2.0])
    g = torch.tensor([7, 2, 7, 2])
    mask, cu = layout(4)
    adv, _ = dr_grpo(scores=r, groups=g, mask=mask, cu_seqlens=cu)
    assert adv.tolist() == pytest.approx(per_token([1.5, -0.5, -1.5, 0.5]))
    # group 7: (3, 0), mean 1.5, sample var 4.5; group 2: (1, 2), mean 1.5, sample var 0.5
    assert group_std(r, g).tolist() == pytest.approx([math.sqrt(4.5), math.sqrt(0.5)] * 2)


def test_token_rewards_are_summed_into_the_sequence_reward():
    # KL in the reward: -0.1 on each response token of sample 0, -0.3 on sample 1; junk on the prompt is ignored
    mask, cu = layout(2)
    tok = torch.tensor([9.0, -0.1, -0.1, 9.0, -0.3, -0.3])
    kw = dict(scores=torch.tensor([1.0, 0.0]), groups=torch.tensor([0, 0]), mask=mask, cu_seqlens=cu,
              token_rewards=tok)
    # totals 0.8 and -0.6: mean 0.1, centred +-0.7; sample std sqrt(2 * 0.49) = 0.7 * sqrt(2)
    assert dr_grpo(**kw)[0].tolist() == pytest.approx(per_token([0.7, -0.7]))
    s = 1 / math.sqrt(2)
    assert grpo(**kw)[0].tolist() == pytest.approx(per_token([s, -s]), rel=1e-5)


def test_overlong_penalty():
    lens = torch.tensor([10, 12, 14, 16, 20])
    # max 16, buffer 4: free up to 12, linear to -0.5 at 16, capped beyond
    assert overlong_penalty(lens, 16, 4, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.5])
    assert overlong_penalty(lens, 16, 0, 0.5).tolist() == [0.0] * 5
