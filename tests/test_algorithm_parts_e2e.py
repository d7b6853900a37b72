"""Named algorithm parts in real runs through ``rlweave train`` (FSDP policy, HF engine):

* a third-party advantage estimator and a third-party rollout, packaged outside the repository
  (``tests/third_party/estimator``, ``tests/third_party/rollout``, installed into a folder on
  ``PYTHONPATH`` as pip would), are listed by ``rlweave list-plugins`` and used in one run when a
  config names them (in process: ``run.scheduler: in_process``; both run in the controller);
* GRPO (on Ray) rewarded by a rule and a learned reward model together (the model sharing the policy's
  and the reference's device, moved in and out by residency), with ReMax's greedy baseline, GSPO's loss, Dr.GRPO's
  aggregation and a k2 KL in the reward: every source reports its mean and failures, and the
  policy moves.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("rlweave_test_installer_tp",
                                               REPO / "core" / "tests" / "plugin_dists" / "installer.py")
installer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(installer)

pytestmark = pytest.mark.slow


#: a reward with spread on a random model (exact match is 0 for every sample there)
LENGTH_REWARD = "def length(prompt, response, **fields):\n    return float(len(response))\n"


def _length_reward(tmp_path: Path) -> Path:
    (tmp_path / "parts_rewards.py").write_text(LENGTH_REWARD)
    return tmp_path


def _moved(ws, run_dir: Path) -> bool:
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    return any(not torch.equal(before[k], after[k]) for k in before)


def test_a_third_party_estimator_and_rollout_are_listed_and_train(grpo_workspace, tmp_path):
    site = installer.install(["estimator", "rollout"], tmp_path / "site", where=REPO / "tests" / "third_party")
    log, rollout_log = tmp_path / "calls.jsonl", tmp_path / "rollout.jsonl"
    env = cli_env(site, _length_reward(tmp_path), RLW_SIGN_ESTIMATOR_LOG=str(log), RLW_HINT_ROLLOUT_LOG=str(rollout_log))
    rc, out, pids = run_cli(["list-plugins", "--json"], env)
    assert rc == 0, out[-2000:]
    rows = {(r["kind"], r["name"]): r for r in json.loads(out[out.index("["):])}
    row = rows[("advantage", "sign_baseline")]
    assert row["status"] == "ok" and row["distribution"] == "rlweave-testplug-sign-estimator", row
    row = rows[("rollout", "hinted")]
    assert row["status"] == "ok" and row["distribution"] == "rlweave-testplug-hint-rollout", row
    assert ("advantage", "rloo") in rows and ("policy_loss", "gspo") in rows
    assert ("rollout", "single_turn") in rows and ("run_mode", "one_step_off") in rows

    ws = grpo_workspace
    cfg = ws.config("sign", 2, algorithm={"advantage": {"name": "sign_baseline", "scale": 0.5}},
                    rewards=[{"name": "parts_rewards:length"}], run={"scheduler": "in_process"},
                    rollout={"name": "hinted", "args": {"hint": "1+"}})
    rc, out, pids = run_cli(["train", str(cfg)], env)
    assert rc == 0, out[-4000:]
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(calls) == 2 and all(c["scale"] == 0.5 and c["samples"] == 16 for c in calls), calls
    runs = [json.loads(x) for x in rollout_log.read_text().splitlines()]
    trained = [r for r in runs if r["records"] == 4]  # the others: held-out evaluation, through the rollout too
    assert len(trained) == 2 and all(r["samples"] == 16 for r in trained), runs
    assert len(runs) > 2 and all(r["hint"] == "1+" for r in runs), runs
    assert all(r["first_prompt"].startswith("1+") and r["first_prompt"].endswith("=") for r in runs), runs
    run_dir = ws.root / "runs" / "sign"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert len(steps) == 2
    for r in steps:  # advantages are +-0.5 or 0 on every trained token
        assert r["adv/min"] >= -0.5 and r["adv/max"] <= 0.5, r
    assert _moved(ws, run_dir)
    used = json.loads((run_dir / "plugins.json").read_text())
    assert (used["selected"]["rollout"], used["selected"]["run_mode"]) == ("hinted", "sync"), used["selected"]
    assert {"rlweave-testplug-sign-estimator", "rlweave-testplug-hint-rollout"} <= {p["distribution"]
                                                                                  for p in used["plugins"]}
    assert not leftovers(pids)


def test_grpo_with_a_reward_model_remax_and_gspo(grpo_workspace, tmp_path):
    ws = grpo_workspace
    cfg = ws.config(
        "rm-remax", 2,
        resources={"pools": {"default": {"devices_per_node": 2}}, "colocate": [["policy", "reference", "reward"]],
                   "offload": "always"},
        roles={"reward": {"backend": "fsdp", "devices": 1, "model": {"path": str(ws.model), "model_type": "reward"}},
               "reference": {"backend": "fsdp", "devices": 1}},
        algorithm={"advantage": "remax", "policy_loss": "gspo", "loss_agg": "seq_mean_token_sum_norm",
                   "reward_models": [{"role": "reward", "weight": 0.5}],
                   "kl": {"beta": 0.05, "estimator": "k2", "in_reward": True}},
        rewards=[{"name": "parts_rewards:length"}],
    )
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(_length_reward(tmp_path)))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "rm-remax"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert len(steps) == 2
    for r in steps:
        for key in ("reward/reward", "reward/greedy_mean", "reward/parts_rewards:length", "kl_reward", "time/baseline",
                    "grad_norm"):
            assert key in r and math.isfinite(r[key]), (key, r)
        assert r["reward/reward/failed"] == 0.0
        assert r["time/baseline"] > 0
        assert r["offload/moves"] > 0  # the reward model and the policy take turns on their device
        assert r["reward/reward"] != 0.0  # a randomly initialised head scores something
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert "remax" in resolved and "gspo" in resolved
    assert _moved(ws, run_dir)
    assert not leftovers(pids)
