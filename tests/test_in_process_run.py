"""GRPO through ``rlweave train`` with ``run.scheduler: in_process``: every role in the
controller's process, Ray never imported (tiny model, FSDP policy, HF engine, 2 steps).

The command runs in a subprocess whose path starts with a stand-in ``ray`` package: importing
it writes a line to a file and fails. The run must finish without touching it, train (finite
loss and rewards), list every role in the controller's process (``workers.json``), move the
policy's weights into the engine after every update (the step's ``sync_bytes``), and the engine
must generate with them: at step 2 the log-probs it reports for its samples equal the policy's
own (``logprob_gap`` ~1e-7; 0.3 when the engine keeps its weights). A reward on the response's
length makes every step's update move the weights.
Loading refuses what the scheduler cannot do, naming the key (``rlweave validate``).
"""

from __future__ import annotations

import json
import math

from rlweave.testing.runs import cli_env, metrics_rows, run_cli, workers

STAND_IN_RAY = '''import os, traceback
with open(os.environ["RAY_IMPORTED_LOG"], "a") as f:
    f.write("".join(traceback.format_stack()) + "\\n")
raise ImportError("ray is not available in this test")
'''


#: rewards differ inside every group, so every step changes the weights
LENGTH_REWARD = "def length(prompt, response, **fields):\n    return 0.1 * len(response)\n"


def test_grpo_runs_in_process_without_ray(grpo_workspace, tmp_path):
    ws = grpo_workspace
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(STAND_IN_RAY)
    log = tmp_path / "ray_imported.log"
    (tmp_path / "length_reward.py").write_text(LENGTH_REWARD)
    rewards = [{"name": "arith_exact"}, {"name": f"{tmp_path / 'length_reward.py'}:length", "weight": 0.5}]
    config = ws.config("in-process", 2, run={"scheduler": "in_process"}, logging={"backends": ["jsonl"]},
                       rewards=rewards)
    rc, out, _ = run_cli(["train", str(config)], cli_env(tmp_path, RAY_IMPORTED_LOG=str(log)))
    assert rc == 0, out[-4000:]
    assert not log.exists(), log.read_text()[-3000:]
    run_dir = ws.root / "runs" / "in-process"
    placed = workers(run_dir)
    assert set(placed) == {"policy", "rollout"}
    assert len({r["pid"] for ranks in placed.values() for r in ranks}) == 1  # one process: the controller's
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("loss", "reward/mean", "logprob_gap"):
            assert math.isfinite(r[key]), (key, r)
        assert r["loss"] != 0.0, r  # the update moved the weights
        assert r["sync_bytes"] > 0
    assert steps[1]["logprob_gap"] < 1e-3, steps[1]
    assert json.loads((run_dir / "summary.json").read_text())["hf_path"]


def test_loading_refuses_what_in_process_cannot_do(grpo_workspace):
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    config = grpo_workspace.config("in-process-refused", 1)
    overrides = ["run.scheduler=in_process", "roles.policy.devices=2", "run.max_restarts=1",
                 "weight_sync.transport=broadcast", "resources.pools.default.devices_per_node=3"]
    try:
        load_config(config, overrides, check_inputs=False)
    except ConfigError as exc:
        text = str(exc)
    else:
        raise AssertionError("the config loaded")
    for key in ("roles.policy.devices", "run.max_restarts", "weight_sync.transport"):
        assert f"{key}: " in text and "in_process" in text.split(f"{key}: ")[1].splitlines()[0], (key, text)
    load_config(config, ["run.scheduler=in_process"], check_inputs=False)  # the same run on one rank each loads
