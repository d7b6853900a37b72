"""End-to-end GRPO through ``rlweave train`` with the policy on the DeepSpeed backend at ZeRO-3
over two Ray ranks (gloo), the HF engine generating with the weights streamed from it after
every step, a checkpoint and the Hugging Face export; then ``--resume`` continues that run with
the policy on one rank at ZeRO-1 (the checkpoint holds full tensors), in process."""

from __future__ import annotations

import json

import pytest

from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytest.importorskip("deepspeed", reason="deepspeed not installed")
pytestmark = pytest.mark.slow


def test_grpo_with_a_zero3_policy_trains_syncs_saves_and_resumes_on_one_rank(grpo_workspace):
    ws = grpo_workspace
    sections = dict(
        run={"save_every": 2},
        resources={"pools": {"default": {"devices_per_node": 3}}},
        roles={"policy": {"backend": "deepspeed", "devices": 2, "parallel": {"dp": 2},
                          # no parameter kept whole on a rank: the tiny model's are all under DeepSpeed's default
                          "options": {"zero_stage": 3, "ds_config": {
                              "zero_optimization": {"stage3_param_persistence_threshold": 0}}}}})
    cfg = ws.config("ds", 2, **sections)
    env = cli_env(ws.root)
    rc, out, pids = run_cli(["train", str(cfg)], env)
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "ds"
    ckpt = run_dir / "checkpoints" / "step_000002" / "roles" / "policy"
    index = json.loads((ckpt / "deepspeed.json").read_text())
    assert index["zero_stage"] == 3 and index["world_size"] == 2 and index["optimizer_step"] == 2
    assert (run_dir / "hf" / "config.json").is_file()
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["samples"] == 16.0 for r in steps), steps
    assert pids and not leftovers(pids)

    rc, out, pids = run_cli(["train", str(cfg), "--resume", "--run-dir", str(run_dir), "run.total_steps=3",
                             "run.scheduler=in_process", "roles.policy.devices=1", "roles.policy.parallel.dp=1",
                             "roles.policy.options.zero_stage=1"], env)
    assert rc == 0, out[-4000:]
    assert "resumed from" in out
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps][-1] == 3
    assert pids is not None and not leftovers(pids)
