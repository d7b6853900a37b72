"""Mini-batch splitting and the shared sampling keys of the generating algorithms."""

from __future__ import annotations

import pytest

from rlweave.algo_helpers.minibatch import split
from rlweave.algo_helpers.sampling import SamplingConfig


def test_split_keeps_order_and_balances():
    assert split([4, 2, 7, 1, 0], 2) == [[4, 2], [7, 1, 0]]
    assert split(list(range(6)), 3) == [[0, 1], [2, 3], [4, 5]]
    assert split([9, 8], 4) == [[9], [8]]  # fewer samples than parts: no empty mini-batch
    assert sum(split(list(range(37)), 5), []) == list(range(37))


def test_sampling_keys_are_strict_and_bounded():
    assert SamplingConfig().model_dump() == {"n_samples": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                             "max_new_tokens": 64, "eval_greedy": True}
    for bad in ({"temperature": 0}, {"top_p": 1.5}, {"max_new_tokens": 0}, {"n_samples": 0}, {"topp": 0.9}):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_step_metrics_helpers():
    from rlweave.algo_helpers.step_metrics import key_means, reward_breakdown, truncated_frac

    rows = [{"loss": 1.0, "lr": 0.1}, {"loss": 3.0}, {}]
    assert key_means(rows, ("loss", ("lr", "critic/lr"), "missing")) == {"loss": 2.0, "critic/lr": 0.1}
    breakdown = [{"a": 1.0, "b": "x", "failed": []}, {"a": 0.0, "b": 2, "failed": ["b"]}]
    assert reward_breakdown(breakdown) == {"reward/a": 0.5, "reward/b": 2.0, "reward/failed": 1.0}
    assert truncated_frac([{"finish_reason": "length"}, {"finish_reason": "stop"}]) == 0.5
    assert truncated_frac([]) == 0.0


def test_prefixed_means_pass_on_a_backends_own_metrics():
    from rlweave.algo_helpers.step_metrics import MOE_PREFIX, prefixed_means

    rows = [{"moe_aux_loss": 1.0, "moe_load_max_over_mean": 2.0, "loss": 5.0}, {"moe_aux_loss": 3.0}]
    assert prefixed_means(rows, MOE_PREFIX) == {"moe_aux_loss": 2.0, "moe_load_max_over_mean": 2.0}
    assert prefixed_means(rows, MOE_PREFIX, "critic/") == {"critic/moe_aux_loss": 2.0,
                                                           "critic/moe_load_max_over_mean": 2.0}
    assert prefixed_means([{"loss": 1.0}], MOE_PREFIX) == {}
