"""GRPO with an agent (``algorithm.multi_turn.agent``) through ``rlweave train``, every role in the
controller's process (``run.scheduler: in_process``, FSDP policy, HF engine, tiny model): the
scripted agent calls a tool through the stock ``openai`` client on each episode, and on records
whose prompt ends with "7=" it raises after its first turn. The run trains (finite, non-zero loss),
counts those episodes as errors and goes on; the rule reward scores the other episodes' final
answers (a reward on their length, so every step moves the weights). In ``sync`` and in
``one_step_off`` (the next step's agents run while a step trains)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
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
        assert math.isfinite(r["loss"]) and r["loss"] != 0.0, r
        assert r["episode/requests_mean"] >= 1 and r["episode/tool_used_frac"] > 0, r
    errors = sum(r["episode/error_frac"] for r in steps)
    assert errors > 0, steps  # the agent's failures were counted, and the run went on
    assert "the agent's own bug" in out
