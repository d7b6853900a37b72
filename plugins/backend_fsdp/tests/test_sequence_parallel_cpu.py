"""Ulysses sequence parallelism (``parallel: {sp: 2}``) on 2 CPU processes over gloo, fp32,
against the same worker without it (one process): log-probs, entropy, values, scores and one
train step's full gradients agree within 1e-5, for a GQA model with fewer key/value heads than
``sp`` (heads repeated), rows whose length needs padding, several packed micro-batches,
shared-prompt rows and activation checkpointing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

testing_sp = import_helper(Path(__file__).with_name("sp_scenarios.py"))

TOL = 1e-5

# (name, case keywords besides model_dir)
CASES = [
    ("several_micro_batches", {"batch": "fixed", "budget": 32}),
    ("odd_length_row", {"batch": "odd"}),
    ("shared_prompts", {"batch": "groups"}),
    ("activation_checkpointing", {"batch": "fixed", "activation_checkpointing": True}),
    ("value_head", {"batch": "odd", "kind": "value", "budget": 16}),
    ("reward_head", {"batch": "fixed", "kind": "reward"}),
]


def _with_value_head(model_dir: Path, out: Path) -> str:
    """A copy of ``model_dir`` carrying a random ``score.weight`` (a critic's head), so that
    values and the backbone's gradients are not zero."""
    shutil.copytree(model_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    hidden = weights["model.embed_tokens.weight"].shape[1]
    weights["score.weight"] = torch.randn(1, hidden, generator=torch.Generator().manual_seed(4)) * 0.3
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case at sp=1 (one rank) and sp=2 (two ranks); the model has 4 query heads and 1
    key/value head, so sp=2 repeats it."""
    root = tmp_path_factory.mktemp("sp_tiny")
    model = build_tiny_qwen2(root / "model", seed=1, heads=4, kv_heads=1)
    critic = _with_value_head(model, root / "critic")
    cases = [dict(kw, model_dir=critic if kw.get("kind") == "value" else str(model)) for _, kw in CASES]
    one = run_ranks(testing_sp.sp_scenario, 1, 1, cases, timeout_s=600)
    two = run_ranks(testing_sp.sp_scenario, 2, 2, cases, timeout_s=600)
    return {name: (a, b) for (name, _), a, b in zip(CASES, one, two)}


def _maxdiff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", [n for n, kw in CASES if kw.get("kind", "causal_lm") == "causal_lm"])
def test_logprobs_entropy_and_gradients_equal_without_sp(results, name):
    one, two = results[name]
    assert _maxdiff(one["logprobs"], two["logprobs"]) < TOL
    assert _maxdiff(one["entropy"], two["entropy"]) < TOL
    assert min(float(v[1:].min()) for v in two["entropy"].values() if v.numel() > 1) > 0
    assert _maxdiff(one["grads"], two["grads"]) < TOL
    assert max(float(g.abs().max()) for g in two["grads"].values()) > 1e-3  # a real gradient, not zeros
    # each token counted once: the reported loss and token count are the group's, not doubled
    for key in ("loss", "tokens", "samples", "nll"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-6, abs=1e-7), key


def test_values_and_value_gradients_equal_without_sp(results):
    one, two = results["value_head"]
    assert _maxdiff(one["values"], two["values"]) < TOL
    assert _maxdiff(one["grads"], two["grads"]) < TOL
    assert float(two["grads"]["model.layers.0.mlp.down_proj.weight"].abs().max()) > 1e-3
    assert two["metrics"]["num_micro_batches"] > 1


def test_reward_scores_equal_without_sp(results):
    one, two = results["reward_head"]
    assert float((one["scores"] - two["scores"]).abs().max()) < TOL
    assert float(two["scores"].abs().max()) > 0


@pytest.mark.slow
def test_two_data_parallel_groups_of_two_ranks_equal_plain_data_parallel(tmp_path):
    """``{dp: 2, sp: 2}`` on 4 ranks: each group's log-probs, and the gradient summed over both
    groups, equal ``{dp: 2}`` on 2 ranks with the same shards; the step's metrics count each
    group once."""
    model = str(build_tiny_qwen2(tmp_path / "model", seed=1, heads=4, kv_heads=2))
    plain = run_ranks(testing_sp.dp_sp_scenario, 2, 1, model, timeout_s=600)
    split = run_ranks(testing_sp.dp_sp_scenario, 4, 2, model, timeout_s=600)
    assert _maxdiff(plain["logprobs"], split["logprobs"]) < TOL
    assert _maxdiff(plain["grads"], split["grads"]) < TOL
    for key in ("loss", "tokens", "samples"):
        assert split["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-6), key
