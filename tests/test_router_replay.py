"""MoE router replay on a tiny Qwen3-MoE (8 experts, top-2): the FSDP backend replays a batch's
``routing`` field on 100% of tokens through packing, padding, shared prompts, micro-batching and
activation checkpointing, the gate keeps its gradient, and the HF engine's recorded routing
(R3) makes the trainer choose the engine's experts and close the trainer/engine log-prob gap of
a bfloat16 engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen3_moe

sc = import_helper(Path(__file__).with_name("router_replay_scenarios.py"))
EXPERTS = 8
PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [20, 21, 22, 23, 24, 25]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(build_tiny_qwen3_moe(tmp_path_factory.mktemp("router") / "q3", seed=1))


@pytest.fixture(scope="module")
def replay(model):
    return run_ranks(sc.replay_scenario, 1, model, EXPERTS, timeout_s=600)


@pytest.fixture(scope="module")
def r3(model):
    return run_ranks(sc.r3_scenario, 1, model, PROMPTS, 12, timeout_s=600)


@pytest.mark.parametrize("layout", ["packed", "padded", "shared"])
def test_replayed_routing_is_the_routing_used_on_every_token(replay, layout):
    r = replay[layout]
    assert (r["given"] != r["own"]).all()  # a routing the router would not choose anywhere
    assert torch.equal(r["chosen"], r["given"])  # 100% of tokens, every layer, both experts
    assert not torch.allclose(r["lp_replay"], r["lp_own"])  # the experts changed the outputs
    assert torch.equal(r["lp_again"], r["lp_own"])  # nothing left set after a replayed pass


@pytest.mark.parametrize("layout", ["packed", "padded", "shared"])
def test_the_training_forward_replays_and_the_gate_gets_its_gradient(replay, layout):
    r = replay[layout]
    assert r["wlp_train"] == pytest.approx(r["wlp_pass"], abs=1e-5)  # train forward == replayed no-grad pass
    assert all(g > 0 for g in r["router_grads"])
    assert r["changed"] == 1.0  # the step's metric: every replayed decision differs from the router's own
    assert r["changed_unreplayed"] == "absent"  # nothing replayed, no metric


def test_r3_trainer_experts_equal_the_engines_and_the_logprob_gap_drops(r3):
    engine, chosen, cu = r3["engine"], r3["chosen"], r3["cu"]
    known = (engine >= 0).all(-1).all(-1)
    last = cu[1:] - 1
    assert not known[last].any() and known.sum() == len(known) - len(last)  # all but each sample's last token
    assert torch.equal(chosen[known], engine[known])  # 100% of the tokens the engine routed
    on = r3["mask"] > 0
    gap_free = (r3["lp_free"] - r3["rollout"]).abs()[on].mean()
    gap_replay = (r3["lp_replay"] - r3["rollout"]).abs()[on].mean()
    disagree = float((r3["free"][known] != engine[known]).any(-1).any(-1).float().mean())
    print(f"R3 bf16 engine vs fp32 trainer: mean |dlogp| {gap_free:.3e} free, {gap_replay:.3e} replayed "
          f"({gap_free / gap_replay:.1f}x); tokens routed differently without replay: {disagree:.1%}")
    assert gap_replay < gap_free
