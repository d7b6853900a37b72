"""GRPO with multi-turn episodes through ``rlweave train`` (in process: FSDP policy, HF engine):
an environment given as ``path/to/file.py:Class`` answers every model turn until its third, the
loss trains the model's tokens of every turn, the episode metrics are written, and nothing is left
running."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
ENV = f"{Path(__file__).with_name('multi_turn_scenarios.py')}:Countdown"


def test_grpo_trains_on_multi_turn_episodes(grpo_workspace):
    ws = grpo_workspace
    cfg = ws.config("multi-turn", 2, run={"scheduler": "in_process"},
                    algorithm={"multi_turn": {"env": {"name": ENV}, "max_turns": 3, "max_total_tokens": 40,
                                                  "end_on_length": False}})
    rc, out, pids = run_cli(["train", str(cfg)], cli_env())
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "multi-turn"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert len(steps) == 2
    for r in steps:
        assert r["episode/turns_mean"] > 1.5 and r["episode/tool_calls_mean"] > 0.5, r
        assert 0 <= r["episode/limit_frac"] <= 1 and r["samples"] == 16
        assert r["response_len/mean"] > r["episode/turns_mean"]  # observations are part of the episode
        assert torch.isfinite(torch.tensor(r["loss"]))
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not leftovers(pids)


def test_multi_turn_config_errors_come_before_any_worker(grpo_workspace):
    ws = grpo_workspace
    cfg = ws.config("mt-bad", 1, algorithm={"multi_turn": {"env": {"name": "tools", "args": {"tools": []}}}})
    rc, out, _ = run_cli(["validate", str(cfg)], cli_env())
    assert rc != 0 and "algorithm.multi_turn.env" in out and "tools" in out, out[-2000:]
    cfg = ws.config("mt-mode", 1, run={"mode": "one_step_off"},
                    algorithm={"multi_turn": {"env": {"name": ENV}}})
    rc, out, _ = run_cli(["validate", str(cfg)], cli_env())
    assert rc != 0 and "one_step_off" in out, out[-2000:]
