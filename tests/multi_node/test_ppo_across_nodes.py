"""PPO with its roles spread over three nodes of the shared cluster, through ``rlweave train``
joining it with ``ray.address``: the policy, the rollout engine and the critic each on a node of
its own (the smallest PPO: the rule reward ``arith_exact``, no KL penalty, so no reference and no
reward model). Experience comes from three nodes, the policy and the critic train on different
nodes, and weights reach the rollout node through the object store (what
``weight_sync.transport: auto`` picks on CPU)."""

from __future__ import annotations

import json
import math

import pytest

from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

from .conftest import REPO, SPREAD, nodes_of, ranks_left

pytestmark = pytest.mark.slow


def test_ppo_with_roles_spread_over_three_nodes(nodes, workspace):
    root, model = workspace.root, str(workspace.model)
    config = {
        "run": {"name": "ppo-nodes", "output_dir": str(root / "runs"), "seed": 3, "total_steps": 1, "save_hf": False},
        "ray": {"address": nodes.address},
        "model": {"path": model, "dtype": "float32"},
        "resources": {"pools": {"default": {"nodes": SPREAD, "devices_per_node": 1}}},
        "roles": {
            "policy": {"backend": "fsdp", "optim": {"lr": 1.0e-3}},
            "rollout": {"engine": "hf"},
            "critic": {"backend": "fsdp", "model": {"path": model, "model_type": "value"}, "optim": {"lr": 1.0e-3}},
        },
        "algorithm": {"name": "ppo", "reward_models": [], "kl": {"beta": 0.0}, "n_samples": 2, "max_new_tokens": 3,
                      "eval_max_new_tokens": 3},
        "rewards": [{"name": "arith_exact"}],
        "data": {"train": str(workspace.train), "eval": str(workspace.test), "batch_size": 4},
    }
    path = root / "ppo-nodes.yaml"
    path.write_text(json.dumps(config))
    rc, out, pids = run_cli(["train", str(path)], cli_env(), cwd=REPO, timeout=300)
    assert rc == 0, out[-4000:]
    run_dir = root / "runs" / "ppo-nodes"
    where = nodes_of(run_dir)
    assert sorted(where) == ["critic", "policy", "rollout"] and all(len(n) == 1 for n in where.values())
    three = set().union(*where.values())
    assert len(three) == 3 and three <= set(nodes.gpu_node_ids())
    (step,) = [r for r in metrics_rows(run_dir) if r["step"] == 1]
    assert step["sync_bytes"] > 0 and math.isfinite(step["value_loss"]) and math.isfinite(step["loss"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after"] is not None and (run_dir / "checkpoints" / "step_000001" / "COMPLETE").is_file()
    assert not leftovers(pids) and not ranks_left(run_dir)
