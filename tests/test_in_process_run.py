"""GRPO through ``rlweave train`` with ``run.scheduler: in_process``: every role in the
controller's process, Ray never imported (tiny model, FSDP policy, HF engine, 2 steps), on the
CPU and, with the ``gpu`` marker, on a CUDA GPU (``scripts/gpu_check.sh`` runs it there).

The command runs in a subprocess whose path starts with a stand-in ``ray`` package: importing
it writes a line to a file and fails. The run must finish without touching it, train (finite,
non-zero loss), list every role in the controller's process on the expected device
(``workers.json``), move the policy's weights into the engine after every update (the step's
``sync_bytes``), and the engine must generate with them: at step 2 the log-probs it reports for
its samples equal the policy's own (``logprob_gap`` ~1e-7; 0.3 when the engine keeps its
weights; every step's ``mismatch/*`` metrics, all of its tokens fresh). A reward on the response's
length makes every step's update move the weights. The same in ``one_step_off`` with
``run.in_process_threads`` (the engine's calls on a thread of their own), 3 steps, two updates
a step with IcePop's correction in ``bypass`` mode: steps 2 and 3 train samples one version old,
step 3's on the weights synced after step 1, their mismatch is reported by staleness, and the
old log-probs are never recomputed (no ``time/old_logprobs``). Loading refuses what the scheduler
cannot do, naming the key.
"""

from __future__ import annotations

import json
import math

import pytest

from rlweave.testing.runs import cli_env, length_reward, metrics_rows, run_cli, workers

STAND_IN_RAY = '''import os, traceback
with open(os.environ["RAY_IMPORTED_LOG"], "a") as f:
    f.write("".join(traceback.format_stack()) + "\\n")
raise ImportError("ray is not available in this test")
'''


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def train_in_process(ws, tmp_path, name: str, device: str, threads: bool = False) -> list[dict]:
    """Run 2 GRPO steps in process with the pool's ``device`` (``cpu`` or ``gpu``); check what
    the module docstring promises and return the metrics rows of the steps. With ``threads``:
    3 steps of ``run.mode: one_step_off`` with ``run.in_process_threads``, each step after the
    first training samples the engine generated while the step before it trained."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(STAND_IN_RAY)
    log = tmp_path / "ray_imported.log"
    rewards = [{"name": "arith_exact"}, {"name": length_reward(tmp_path), "weight": 0.5}]
    run = {"scheduler": "in_process", **({"mode": "one_step_off", "in_process_threads": True} if threads else {})}
    algorithm = {"ppo_epochs": 2, "off_policy": {"correction": "icepop", "mode": "bypass"}} if threads else {}
    config = ws.config(name, 3 if threads else 2, run=run, logging={"backends": ["jsonl"]}, rewards=rewards,
                       resources={"pools": {"default": {"devices_per_node": 2, "device": device}}},
                       algorithm=algorithm)
    rc, out, _ = run_cli(["train", str(config)], cli_env(tmp_path, RAY_IMPORTED_LOG=str(log)))
    assert rc == 0, out[-4000:]
    assert not log.exists(), log.read_text()[-3000:]
    run_dir = ws.root / "runs" / name
    placed = workers(run_dir)
    assert set(placed) == {"policy", "rollout"}
    ranks = [r for rs in placed.values() for r in rs]
    assert len({r["pid"] for r in ranks}) == 1  # one process: the controller's
    assert {r["device"] for r in ranks} == {"cuda" if device == "gpu" else "cpu"}
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == ([1, 2, 3] if threads else [1, 2])
    for r in steps:
        for key in ("loss", "reward/mean", "logprob_gap", "mismatch/k1", "mismatch/k3", "mismatch/chi2",
                    "mismatch/dlogp_abs_p99"):
            assert math.isfinite(r[key]), (key, r)
        assert r["mismatch/tokens"] > 0 and r["mismatch/k3"] >= 0.0, r
        # an update that moved the weights, then a sync (begun beside generation with threads: no bytes counted)
        assert r["loss"] != 0.0 and (threads or r["sync_bytes"] > 0), r
    if threads:  # one version old from step 2 on; at step 3 on the weights synced after step 1 (else 2 old)
        assert [r["staleness/max"] for r in steps] == [0.0, 1.0, 1.0], steps
        assert all(r["mismatch/stale1/tokens_frac"] > 0 and "offpolicy/iw_mean" in r for r in steps[1:]), steps
        assert not any("time/old_logprobs" in r for r in steps), steps  # bypass: that pass never ran
    else:
        assert steps[1]["logprob_gap"] < 1e-3 and steps[1]["mismatch/dlogp_abs_p99"] < 1e-3, steps[1]
        assert all(r["mismatch/stale0/tokens_frac"] == 1.0 for r in steps), steps
    assert json.loads((run_dir / "summary.json").read_text())["hf_path"]
    return steps


def test_grpo_runs_in_process_without_ray(grpo_workspace, tmp_path):
    train_in_process(grpo_workspace, tmp_path, "in-process", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_grpo_runs_in_process_on_the_gpu(grpo_workspace, tmp_path, record_property):
    steps = train_in_process(grpo_workspace, tmp_path, "in-process-gpu", "gpu")
    record_property("key_figure", f"GRPO via rlweave train in process on cuda: {steps[1]['time/step']:.2f} s/step, "
                                  f"logprob gap {steps[1]['logprob_gap']:.1e}")


def test_one_step_off_runs_in_process_on_threads(grpo_workspace, tmp_path):
    train_in_process(grpo_workspace, tmp_path, "in-process-threads", "cpu", threads=True)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_one_step_off_runs_in_process_on_threads_on_the_gpu(grpo_workspace, tmp_path, record_property):
    steps = train_in_process(grpo_workspace, tmp_path, "in-process-threads-gpu", "gpu", threads=True)
    record_property("key_figure", f"GRPO one_step_off in process on threads on cuda: {steps[1]['time/step']:.2f} "
                                  "s/step")


def test_loading_refuses_what_in_process_cannot_do(grpo_workspace):
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    config = grpo_workspace.config("in-process-refused", 1)
    overrides = ["run.scheduler=in_process", "roles.policy.devices=2", "run.max_restarts=1",
                 "weight_sync.transport=broadcast", "resources.pools.default.devices_per_node=3"]
    with pytest.raises(ConfigError) as info:
        load_config(config, overrides, check_inputs=False)
    text = str(info.value)
    for key in ("roles.policy.devices", "run.max_restarts", "weight_sync.transport"):
        assert f"{key}: " in text and "in_process" in text.split(f"{key}: ")[1].splitlines()[0], (key, text)
    load_config(config, ["run.scheduler=in_process"], check_inputs=False)  # the same run on one rank each loads
