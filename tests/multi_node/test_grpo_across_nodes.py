"""GRPO over several nodes of the shared cluster, through ``rlweave train`` joining it with
``ray.address`` (tiny fp32 Qwen2, HF rollout engine, FSDP policy, CPU ranks on virtual GPUs).

The policy and the rollout engine run on different nodes and weights cross between them over a
gloo broadcast group after every update; the run passes the shared-filesystem check at its
start and its ranks write checkpoints into the run directory. Every socket of the run and of the
cluster stays on loopback.

After step 1 the policy's node is killed (every process of it SIGKILLed at once, as a crashed
machine). With ``run.max_restarts: 1`` the run notices the lost rank, rebuilds the policy where
Ray places its bundle again (a free node; Ray may first still send the new rank to the dead
node, which it has not noticed yet), goes back to the step-1 checkpoint, joins a new broadcast
group and finishes. One run shows all of this: a second would cost as much again.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli, workers

from .conftest import LOOPBACK, REPO, inet_addresses, nodes_of, ranks_left, tree

pytestmark = pytest.mark.slow


def cli_processes() -> set[int]:
    """The ``rlweave train`` processes this test process started, with their descendants."""
    import psutil

    out: set[int] = set()
    for child in psutil.Process().children():
        try:
            if "rlweave.cli" in " ".join(child.cmdline()):
                out |= tree(child.pid)
        except psutil.Error:
            continue
    return out


def test_grpo_across_nodes_survives_losing_the_policy_node(nodes, workspace):
    import psutil

    run_dir = workspace.root / "runs" / "grpo-nodes"
    cfg = workspace.config("grpo-nodes", 4, ray={"address": nodes.address},
                           run={"save_every": 1, "max_restarts": 1},
                           resources={"pools": {"default": {"nodes": 2, "devices_per_node": 1}}},
                           weight_sync={"transport": "broadcast"})
    free_before = len(nodes.gpu_node_ids()) - 2
    assert free_before >= 1, "the node-loss part needs a free GPU node"
    seen: dict = {}

    def strike() -> None:  # after step 1 every rank is up: note where they run and every socket, then kill
        if seen or not any(r["step"] >= 1 for r in metrics_rows(run_dir)):
            return
        seen.update(before=nodes_of(run_dir), sockets=inet_addresses(nodes.processes() | cli_processes()))
        (rank,) = workers(run_dir)["policy"]
        seen.update(node=rank["node_id"], pid=rank["pid"], at=time.monotonic(), pids=nodes.kill_node(rank["node_id"]))

    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), cwd=REPO, timeout=300, on_poll=strike)
    assert seen, f"the run never reached step 1: {out[-3000:]}"
    assert rc == 0, out[-4000:]
    before, after = seen["before"], nodes_of(run_dir)
    # placed on two nodes, every socket on loopback
    assert len(before["policy"]) == len(before["rollout"]) == 1 and before["policy"] != before["rollout"]
    assert seen["sockets"] and {ip for ip, _ in seen["sockets"]} <= set(LOOPBACK), seen["sockets"]
    # the policy came back on another live node, the rollout stayed where it was
    assert "restart 1 of 1: rebuilding policy" in out
    assert after["policy"] and seen["node"] not in after["policy"] and after["policy"] != after["rollout"]
    assert after["rollout"] == before["rollout"] and after["policy"] <= set(nodes.gpu_node_ids())
    # every step trained and synced weights across nodes, also after the restart
    rows = metrics_rows(run_dir)
    steps = {r["step"]: r for r in rows if r["step"] >= 1}
    assert sorted(steps) == [1, 2, 3, 4] and rows[-1].get("restarts") == 1.0
    assert all(r["sync_bytes"] > 0 and math.isfinite(r["loss"]) for r in steps.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 1 and (run_dir / "checkpoints" / "step_000004" / "COMPLETE").is_file()
    assert (run_dir / "hf" / "config.json").is_file()
    # nothing of the dead node, the run or its ranks is left
    _, alive = psutil.wait_procs([psutil.Process(p) for p in seen["pids"] if psutil.pid_exists(p)], timeout=15)
    assert not alive, f"processes of the killed node still run: {[p.pid for p in alive]}"
    assert not leftovers(pids) and not ranks_left(run_dir)
