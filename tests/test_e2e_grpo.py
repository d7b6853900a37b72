"""End-to-end GRPO through ``rlweave train`` on a tiny model (HF engine, FSDP backend, Ray).

* a short run writes metrics, summary, plot and a loadable HF checkpoint, survives rewards
  that raise or hang, and leaves no process behind;
* policy and rollout on one device trade places every step, and SIGTERM stops such a run and
  every process.

A run SIGKILLed while it writes a checkpoint, resumed: ``reliability/test_checkpoint_resume_equal.py``.
"""

from __future__ import annotations

import json
import math
import signal
import textwrap

import pytest
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow

# rewards that misbehave on some prompts: one raises, one never returns
BAD_REWARDS = textwrap.dedent('''
    import time
    def flaky(prompt, response, **kw):
        if prompt.startswith("1") or prompt.startswith("3"):
            raise RuntimeError("reward bug")
        if prompt == "5-1=":  # a held-out prompt: evaluated before and after training
            time.sleep(10**6)
        return 0.0
''')


def write_config(ws, name: str, steps: int, save_every: int, bad_rewards: bool = False):
    """Two updates per step (2 epochs x 2 mini-batches); with ``bad_rewards`` a reward that raises
    on a quarter of the prompts and hangs on one held-out prompt (the run must go on)."""
    extra = {}
    if bad_rewards:
        (ws.root / "e2e_bad_rewards.py").write_text(BAD_REWARDS)
        extra = {"rewards": [{"name": "arith_exact"}, {"name": "e2e_bad_rewards:flaky", "weight": 0.5}],
                 "reward_runtime": {"max_failed_share": 1.0, "timeout_s": 1.0}}  # the hang costs 1 s per eval
    return ws.config(name, steps, run={"save_every": save_every}, algorithm={"ppo_epochs": 2, "mini_batches": 2},
                     **extra)


def test_grpo_run_end_to_end(grpo_workspace):
    ws = grpo_workspace
    cfg = write_config(ws, "e2e", steps=3, save_every=0, bad_rewards=True)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "e2e"
    rows = metrics_rows(run_dir)
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for key in ("reward/mean", "loss", "entropy", "clip_frac", "time/generate", "time/train"):
            assert key in r and r[key] is not None and math.isfinite(r[key]), (key, r)
    # the raising and the hanging reward failed some calls, and the run went on
    assert sum(r["reward/failed"] for r in steps) > 0
    assert "eval/accuracy" in rows[0] and rows[0]["step"] == 0 and "eval/accuracy" in steps[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert any((run_dir / "tensorboard").iterdir())
    assert "step 3/3" in out and "eval before" in out and "eval after" in out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    AutoTokenizer.from_pretrained(run_dir / "hf")
    # the process tree is clean: nothing the run started outlives it
    assert pids and not leftovers(pids)


def test_sigterm_stops_a_colocated_run_and_every_process(grpo_workspace):
    """Policy and rollout on one shared device (Ray actors): every step puts the idle role
    away and brings it back (offload/onload, sleep/wake_up over Ray), and the run trains; then
    SIGTERM (a scheduler's stop, ``kill``) mid-run: a clean shut-down of workers, rewards and
    Ray (Ray's own SIGTERM handler must not pre-empt ours), exit code 143, nothing left running."""
    ws = grpo_workspace
    cfg = ws.config("colocated", 200, resources={"pools": {"default": {"devices_per_node": 1}},
                                                 "colocate": [["policy", "rollout"]]},
                    algorithm={"ppo_epochs": 2})
    metrics = ws.root / "runs" / "colocated" / "metrics.jsonl"
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), sig=signal.SIGTERM,
                            kill_when=lambda: metrics.exists() and '"step": 2' in metrics.read_text())
    assert rc == 128 + signal.SIGTERM, out[-4000:]
    assert "interrupted: received signal SIGTERM" in out
    assert pids and not leftovers(pids)
    steps = [r for r in metrics_rows(ws.root / "runs" / "colocated") if r["step"] >= 1]
    assert [r["step"] for r in steps][:2] == [1, 2]
    # policy out for generation, rollout out and policy in for log-probs and training, rollout in to sync
    assert all(r["offload/moves"] == 4 and math.isfinite(r["loss"]) for r in steps), steps
