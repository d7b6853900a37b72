"""Group advantages and overlong shaping against hand-computed values."""

import math

import pytest
import torch

from rlweave_algo_grpo.advantages import group_advantages, group_std
from rlweave_algo_grpo.shaping import overlong_penalty


def test_group_normalised_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    # group 0: mean 0.5, sample std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025
    a = 0.5 / math.sqrt(1 / 3)
    assert group_advantages(r, g, eps=0.0).tolist() == pytest.approx([a, -a, -a, a, 0.0, 0.0, 0.0])
    # eps is added to the std
    assert group_advantages(r, g, eps=0.1)[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1))


def test_dr_grpo_skips_std_division_and_groups_need_not_be_sorted():
    r = torch.tensor([3.0, 1.0, 0.0, 2.0])
    g = torch.tensor([7, 2, 7, 2])
    assert group_advantages(r, g, scale=False).tolist() == pytest.approx([1.5, -0.5, -1.5, 0.5])
    assert group_std(r, g).tolist() == pytest.approx([math.sqrt(4.5), math.sqrt(0.5)] * 2)


def test_overlong_penalty():
    lens = torch.tensor([10, 12, 14, 16, 20])
    # max 16, buffer 4: free up to 12, linear to -0.5 at 16, capped beyond
    assert overlong_penalty(lens, 16, 4, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.5])
    assert overlong_penalty(lens, 16, 0, 0.5).tolist() == [0.0] * 5
