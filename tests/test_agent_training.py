"""GRPO with an agent (``algorithm.multi_turn.agent``) through ``rlweave train``, every role in the
controller's process (``run.scheduler: in_process``, FSDP policy, HF engine, tiny model): the
scripted agent calls a tool through the stock ``openai`` client on each episode, and on records
whose prompt ends with "7=" it raises after its first turn. The run trains (finite loss, non-zero gradient),
counts those episodes as errors and goes on; the rule reward scores the other episodes' final
answers (a reward on their length, so every step moves the weights). In ``sync`` and in
``one_step_off`` (the next step's agents run while a step trains)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rlweave.testing.runs import cli_env, length_reward, metrics_rows, run_cli

pytest.importorskip("openai")
pytest.importorskip("fastapi")
SCENARIOS = Path(__file__).with_name("agent_scenarios.py")


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_grpo_trains_with_an_agent_and_survives_its_errors(grpo_workspace, tmp_path, mode):
    ws = grpo_workspace
    run = {"scheduler": "in_process", "mode": mode, **({"in_process_threads": True} if mode != "sync" else {})}
    multi_turn = {"agent": {"target": f"{SCENARIOS}:mixed_agent", "parser": f"{SCENARIOS}:every_turn_calls",
                            "timeout_s": 60}, "max_turns": 4, "max_total_tokens": 48, "max_in_flight": 8}
    config = ws.config(f"agent-{mode}", 2, run=run, logging={"backends": ["jsonl"]},
                       algorithm={"multi_turn": multi_turn}, data={"batch_size": 4, "shuffle": False},
                       rewards=[{"name": "arith_exact"}, {"name": length_reward(tmp_path), "weight": 0.5}])
    rc, out, _ = run_cli(["train", str(config)], cli_env(tmp_path))
    assert rc == 0, out[-4000:]
    steps = [r for r in metrics_rows(ws.root / "runs" / f"agent-{mode}") if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0, r  # the loss itself may be 0: advantages sum to 0
        assert r["episode/requests_mean"] >= 1 and r["episode/tool_used_frac"] > 0, r
    errors = sum(r["episode/error_frac"] for r in steps)
    assert errors > 0, steps  # the agent's failures were counted, and the run went on
    assert "the agent's own bug" in out


#: what PPO and OnlineDPO add to the workspace's GRPO config, and their extra role
ALGORITHMS = {
    "ppo": ({"name": "ppo", "reward_models": [], "kl": {"beta": 0.0}},
            lambda ws: {"critic": {"backend": "fsdp", "devices": 1, "optim": {"lr": 2.0e-2},
                                   "model": {"path": str(ws.model), "model_type": "value"}}}),
    "online_dpo": ({"name": "online_dpo"}, lambda ws: {"reference": {"backend": "fsdp", "devices": 1}}),
}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_ppo_and_online_dpo_train_exactly_the_ids_the_agent_was_sampled(grpo_workspace, tmp_path, algo):
    """One step of PPO / OnlineDPO whose episodes are agents (two tool-calling turns each, every
    reply asked with its log-probs), the step's batch dumped (``rollout.dump``): each episode's
    trained tokens (loss mask 1) are the tokens its replies carried, with their log-probs, in order,
    and nothing else is trained; the step ends with a finite loss and a gradient that moved the weights."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    ws = grpo_workspace
    algorithm, roles = ALGORITHMS[algo]
    replies = tmp_path / "replies.jsonl"
    multi_turn = {"agent": {"target": f"{SCENARIOS}:recording_agent", "parser": f"{SCENARIOS}:every_turn_calls"},
                  "max_turns": 2, "max_total_tokens": 48}
    config = ws.config(f"agent-{algo}", 1, run={"scheduler": "in_process"}, rollout={"dump": True},
                       resources={"pools": {"default": {"devices_per_node": 3}}}, roles=roles(ws),
                       algorithm={"multi_turn": multi_turn, **algorithm}, logging={"backends": ["jsonl"]},
                       data={"batch_size": 2, "shuffle": False, "eval": None},
                       rewards=[{"name": length_reward(tmp_path)}])
    rc, out, _ = run_cli(["train", str(config)], cli_env(tmp_path, AGENT_REPLIES=str(replies)))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / f"agent-{algo}"
    [step] = [r for r in metrics_rows(run_dir) if r["step"] == 1]
    assert math.isfinite(step["loss"]) and step["grad_norm"] > 0 and step["episode/error_frac"] == 0.0, step
    assert algo != "online_dpo" or step["pairs"] > 0, step
    tok = AutoTokenizer.from_pretrained(ws.model)
    with safe_open(run_dir / "rollouts" / "step_000001.safetensors", "pt") as f:
        ids, mask, lps, cu = (f.get_tensor(f"0.{k}") for k in ("token.input_ids", "token.loss_mask",
                                                                "token.rollout_logprobs", "cu_seqlens"))
    cu = cu.tolist()
    trained = sorted(tuple((tok.decode([int(ids[i])]), round(float(lps[i]), 5)) for i in range(a, b) if mask[i])
                     for a, b in zip(cu, cu[1:]))
    sampled = sorted(tuple((t, round(float(torch.tensor(lp, dtype=torch.float32)), 5)) for turn in ep for t, lp in turn)
                     for ep in map(json.loads, replies.read_text().splitlines()))
    assert len(sampled) == 4 * 2 and all(len(s) > 2 for s in sampled)
    assert trained == sampled
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
