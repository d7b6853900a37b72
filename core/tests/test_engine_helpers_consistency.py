"""logprob_gap: the train/rollout consistency metric."""

from __future__ import annotations

import pytest
import torch

from rlweave.engine_helpers.consistency import logprob_gap


def test_gap_on_masked_tokens_only():
    eng = torch.tensor([0.0, -1.0, -2.0, -3.0])
    train = torch.tensor([5.0, -1.5, -2.0, -2.0])
    gap = logprob_gap(eng, train, mask=torch.tensor([0.0, 1.0, 1.0, 1.0]))
    assert gap == pytest.approx({"mean_abs": 0.5, "max_abs": 1.0, "num_tokens": 3})
    assert logprob_gap(eng, train)["max_abs"] == pytest.approx(5.0)
    assert logprob_gap([-1.0], [-1.0], mask=[0]) == {"mean_abs": 0.0, "max_abs": 0.0, "num_tokens": 0}


def test_gap_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="engine has 2"):
        logprob_gap([0.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="mask has 1"):
        logprob_gap([0.0, 1.0], [0.0, 1.0], mask=[1])
    with pytest.raises(ValueError, match="NaN"):
        logprob_gap([float("nan")], [0.0])
