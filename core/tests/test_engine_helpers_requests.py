"""Per-sample request planning shared by the engines."""

from __future__ import annotations

import json

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.engine_helpers.requests import cut_at_stop, eos_token_ids, plan_requests, sample_seed, stop_token_ids


def test_plan_long_prompt_error_and_budget():
    reqs = plan_requests([[1] * 10, [2] * 3, []], SamplingParams(n=2, max_new_tokens=8, seed=5), max_model_len=10)
    assert len(reqs) == 6 and [r.prompt_index for r in reqs] == [0, 0, 1, 1, 2, 2]
    assert reqs[0].error and "max_model_len=10" in reqs[0].error and reqs[0].max_new_tokens == 0
    assert reqs[2].error is None and reqs[2].max_new_tokens == 7  # 10 - 3 left
    assert "empty" in reqs[4].error
    assert reqs[2].seed == sample_seed(5, 1, 0, 2) != reqs[3].seed


def test_plan_truncate_keeps_tail():
    prompt = list(range(20))
    (r,) = plan_requests([prompt], SamplingParams(max_new_tokens=4), max_model_len=16, long_prompt="truncate")
    assert r.truncated and r.error is None and r.prompt_ids == prompt[-12:] and r.max_new_tokens == 4
    with pytest.raises(ValueError, match="long_prompt"):
        plan_requests([prompt], SamplingParams(), 16, long_prompt="drop")


def test_invalid_params_named():
    with pytest.raises(ValueError, match="top_p=0"):
        plan_requests([[1]], SamplingParams(top_p=0.0), 8)
    with pytest.raises(ValueError, match="top_k=0"):
        plan_requests([[1]], SamplingParams(top_k=0), 8)
    assert sample_seed(None, 0, 0, 1) is None


def test_stops_and_cut(tmp_path):
    assert stop_token_ids(SamplingParams(stop_token_ids=[7]), [2]) == [7, 2]
    assert stop_token_ids(SamplingParams(stop_token_ids=[7], ignore_eos=True), [2]) == [7]
    assert cut_at_stop([5, 7, 9], [-1.0, -2.0, -3.0], [7], 8) == ([5, 7], [-1.0, -2.0], "stop")
    assert cut_at_stop([5, 6, 9], [-1.0, -2.0, -3.0], [7], 2) == ([5, 6], [-1.0, -2.0], "length")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 3}))
    assert eos_token_ids(tmp_path) == [3]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [4, 5]}))
    assert eos_token_ids(tmp_path) == [4, 5]
