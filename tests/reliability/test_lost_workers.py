"""Lost workers in real runs (``rlweave train`` in a subprocess, tiny fp32 GRPO on CPU):

* a hung rank becomes an error naming role, rank and method within 2x its timeout, every
  process ends, the exit code is non-zero and the last complete checkpoint is intact;
* a SIGKILLed vLLM rollout worker is reported with role and rank within 60 s;
* with ``run.max_restarts`` a run survives a SIGKILLed rollout worker and then a policy rank that
  kills itself mid-step, and ends with the weights and data position of an uninterrupted run;
* with several optimizer steps per step (``ppo_epochs: 2, mini_batches: 2``) a recovered run is
  bitwise the shared uninterrupted reference run: weights and every metric of every step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from rlweave.scheduler import faults
from rlweave.testing.runs import cli_env, leftovers, length_reward, metrics_rows, run_cli, workers

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def config(ws, name: str, steps: int, engine: str = "hf", rewards: list[dict] | None = None, **run: object) -> Path:
    """A checkpoint every step, one update per step, the policy's train_step limited to 10 s;
    ``rewards`` replaces the workspace's (``arith_exact``)."""
    rollout = {"engine": engine}
    if engine == "vllm":
        rollout["options"] = {"kv_cache_gib": 0.25, "max_model_len": 64}
    extra = {"rewards": rewards} if rewards else {}
    return ws.config(name, steps, run={"seed": 3, "save_every": 1, **run},
                     roles={"policy": {"timeouts": {"train": 10.0}}, "rollout": rollout}, **extra)


def test_a_hung_rank_is_reported_within_twice_its_timeout(grpo_workspace, guarantee):
    ws = grpo_workspace
    cfg = config(ws, "hang", steps=5)
    ckpts = ws.root / "runs" / "hang" / "checkpoints"
    seen: dict[str, float] = {}

    def watch() -> None:  # the hang starts in step 3's train_step, after step 2's checkpoint
        if "ckpt2" not in seen and (ckpts / "step_000002" / "COMPLETE").exists():
            seen["ckpt2"] = time.monotonic()

    env = cli_env(**{faults.ENV: "policy:0:train_step:hang@3"})
    env.pop("RAY_worker_niceness", None)  # the guarantee holds at Ray's default niceness (15) for the ranks
    rc, out, pids = run_cli(["train", str(cfg)], env, cwd=REPO, timeout=300, on_poll=watch)
    ended = time.monotonic() - seen["ckpt2"]
    assert rc == 1, out[-3000:]
    assert "role 'policy'" in out and "train_step()" in out and "rank(s) 0" in out, out[-3000:]
    assert "roles.policy.timeouts.train" in out
    assert ended < 2 * 10.0, ended
    assert json.loads((ckpts / "step_000002" / "state.json").read_text())["step"] == 2
    assert not (ckpts / "step_000003").exists()
    assert pids and not leftovers(pids)
    guarantee("a hung rank is reported (role, rank, method), everything stops, last checkpoint intact",
              f"timeout 10 s: error and every process gone {ended:.1f} s after the last checkpoint (< 2x timeout)")


def test_a_killed_vllm_rollout_worker_is_reported_within_60_s(grpo_workspace, guarantee):
    pytest.importorskip("vllm")
    ws = grpo_workspace
    cfg = config(ws, "dead-rollout", steps=50, engine="vllm")
    run_dir = ws.root / "runs" / "dead-rollout"
    killed: dict[str, float] = {}

    def strike() -> None:
        if killed or not any(r.get("step", 0) >= 1 for r in metrics_rows(run_dir)):
            return
        pid = workers(run_dir)["rollout"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed["at"], killed["pid"] = time.monotonic(), pid

    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), cwd=REPO, timeout=400, on_poll=strike)
    from rlweave_infer_vllm import scratch

    for folder in scratch.folders_of(killed["pid"]):  # what the killed engine could not remove itself
        scratch.remove(folder)
    took = time.monotonic() - killed["at"]
    assert rc == 1, out[-3000:]
    assert "role 'rollout' rank 0" in out and "died" in out, out[-3000:]
    assert took < 60, took
    assert pids and not leftovers(pids)
    guarantee("a SIGKILLed vLLM rollout worker is reported with role and rank",
              f"run ended naming rollout rank 0 {took:.1f} s after the kill (limit 60 s)")


def final_state(run_dir: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    newest = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return load_file(str(run_dir / "hf" / "model.safetensors")), json.loads((newest / "state.json").read_text())


def test_max_restarts_recovers_lost_workers_like_an_uninterrupted_run(grpo_workspace, guarantee):
    """One run loses two workers, each noticed by its own failure: the rollout worker is
    SIGKILLed from outside once step 1 is logged (so in step 2), and the policy's only rank
    kills itself in its third ``train_step`` (step 2 again after the first restart, or step 3).
    With ``max_restarts: 2`` both are rebuilt and the run ends where an uninterrupted one does.
    A length reward next to ``arith_exact`` makes the steps update the weights (the tiny model
    rarely answers right), so equal weights are not equal because nothing trained."""
    ws = grpo_workspace
    tmp = ws.root
    steps = 3
    rewards = [{"name": "arith_exact"}, {"name": length_reward(tmp), "weight": 0.5}]
    rc, out, pids = run_cli(["train", str(config(ws, "steady", steps, rewards=rewards))], cli_env(), cwd=REPO,
                            timeout=400)
    assert rc == 0, out[-3000:]
    ref_weights, ref_state = final_state(tmp / "runs" / "steady")

    run_dir = tmp / "runs" / "restarts"
    killed: dict[str, int] = {}

    def strike() -> None:
        if killed or not any(r.get("step", 0) >= 1 for r in metrics_rows(run_dir)):
            return
        os.kill(workers(run_dir)["rollout"][0]["pid"], signal.SIGKILL)
        killed["pid"] = 1

    cfg = config(ws, "restarts", steps, rewards=rewards, max_restarts=2)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(**{faults.ENV: "policy:0:train_step:kill@3"}), cwd=REPO,
                            timeout=400, on_poll=strike)
    assert rc == 0, out[-3000:]
    assert killed, "the rollout worker was never killed"
    lost = [line for line in out.splitlines() if "worker lost (" in line]
    assert len(lost) == 2 and "restart 1 of 2" in lost[0] and "restart 2 of 2" in lost[1], out[-3000:]
    assert {"rollout", "policy"} == {line.split("worker lost (", 1)[1].split(":", 1)[0] for line in lost}, lost
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 2
    steps_logged = [r["step"] for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert steps_logged == list(range(1, steps + 1))  # every step once, none lost or repeated
    redone = [r["step"] for r in metrics_rows(tmp / "runs" / "steady") if r["step"] >= 2 and r["grad_norm"] > 0]
    assert redone, "no update in the steps trained again after a restart: the comparison would prove nothing"
    weights, state = final_state(run_dir)
    assert state["data"] == ref_state["data"] and state["algorithm"] == ref_state["algorithm"]
    diff = max((weights[k] - ref_weights[k]).abs().max().item() for k in ref_weights)
    assert weights.keys() == ref_weights.keys() and diff == 0.0, diff
    assert pids and not leftovers(pids)
    guarantee("run.max_restarts rebuilds a lost role and goes on with no prompt lost or used twice",
              f"rollout SIGKILLed and policy rank killed in train_step, one run: 2 restarts, "
              f"max |w - w_uninterrupted| = {diff:g}; data position equal")


def _comparable(row: dict) -> dict:
    """A metrics row without what may differ between equal runs: wall-clock entries and ``restarts``."""
    return {k: v for k, v in row.items() if k not in ("time", "restarts") and not k.startswith("time/")
            and not k.endswith(("_seconds", "_s"))}


def test_max_restarts_with_several_updates_per_step_is_bitwise_the_uninterrupted_run(reference_run, guarantee,
                                                                                     tmp_path):
    """The shared reference run (4 steps, ``ppo_epochs: 2`` x ``mini_batches: 2`` = 4 optimizer steps
    per step, checkpoints at steps 2 and 4, no ``max_restarts``) against the same config with
    ``run.max_restarts=1`` whose policy rank SIGKILLs itself in its third ``compute_logprobs`` (step
    3's old log-probs, after step 2's checkpoint): the policy is rebuilt, the run goes back to step
    2 (the rollout kept alive) and ends with bitwise the reference's weights and metrics. The run
    also writes the step-0 checkpoint that ``max_restarts`` asks for, which must not change it."""
    from safetensors.torch import load_file

    cfg, straight = reference_run.config, reference_run.run_dir
    run_dir = tmp_path / "recovered"
    t0 = time.monotonic()
    rc, out, pids = run_cli(["train", str(cfg), "run.max_restarts=1", "--run-dir", str(run_dir)],
                            cli_env(**{faults.ENV: "policy:0:compute_logprobs:kill@3"}), cwd=REPO, timeout=600)
    took = time.monotonic() - t0
    left = leftovers(pids)
    assert rc == 0, out[-4000:]
    assert not left, f"processes left behind: {left}"
    lost = [line for line in out.splitlines() if "worker lost (" in line]
    assert len(lost) == 1 and "worker lost (policy:" in lost[0] and "from step_000002" in lost[0], lost or out[-3000:]
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
    assert json.loads((run_dir / "summary.json").read_text())["restarts"] == 1

    ref = {r["step"]: _comparable(r) for r in metrics_rows(straight)}
    got = {r["step"]: _comparable(r) for r in metrics_rows(run_dir)}
    assert sorted(got) == sorted(ref) == list(range(0, 5))  # every step once
    assert any(ref[s]["grad_norm"] > 0 for s in (3, 4)), "no update after the recovery: the comparison proves nothing"
    unequal = [(s, k, ref[s].get(k), got[s].get(k)) for s in ref for k in sorted(set(ref[s]) | set(got[s]))
               if ref[s].get(k) != got[s].get(k)]
    a = load_file(str(straight / "hf" / "model.safetensors"))
    b = load_file(str(run_dir / "hf" / "model.safetensors"))
    assert a.keys() == b.keys() and a
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    if diff != 0.0 or unequal:
        pytest.fail(f"recovered run differs from the uninterrupted one: max |dw| {diff:.3e}; unequal metrics "
                    f"{unequal[:6]}")
    guarantee("run.max_restarts with several updates per step is bitwise an uninterrupted run",
              f"ppo_epochs 2 x mini_batches 2, policy rank SIGKILLed in step 3, back to step 2: {len(a)} weight "
              f"tensors bitwise equal, {len(ref[4])} metrics x 4 steps equal (recovered run {took:.0f} s)")
