"""``run.max_restarts`` also recovers from a worker lost before the first step and from one lost
while a recovery is under way (``rlweave train`` in a subprocess, tiny fp32 GRPO on CPU, HF
engine, FSDP policy, sync mode).

One run, two injected SIGKILLs, each firing once in the whole run (``RLWEAVE_FAULTS_FIRED``):
the rollout rank dies in its first ``generate`` (the evaluation before step 1, after the step-0
checkpoint); while that recovery syncs the weights into the rebuilt rollout, the policy rank dies
in its second ``send_weights``. The second loss starts the recovery again (restart 2 of 2), both
from step 0, and the run then trains every step once: every drawn prompt trained exactly once
(:func:`rlweave.testing.chaos.exactly_once`), the algorithm's step and sample counts those of the
steps. (That a recovery ends with the weights of an uninterrupted run is
``test_lost_workers.py``'s.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlweave.scheduler import faults
from rlweave.testing.chaos import exactly_once
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, SAMPLES = 2, 4, 4  # the workspace's batch_size and n_samples


def test_workers_lost_before_the_first_step_and_during_a_recovery_are_recovered(grpo_workspace, guarantee,
                                                                                  tmp_path):
    ws = grpo_workspace
    cfg = ws.config("windows", STEPS, run={"save_every": 1, "max_restarts": 2})
    cut = tmp_path / "cut"
    fired = tmp_path / "fired"
    fired.mkdir()
    env = cli_env(**{faults.ENV: "rollout:0:generate:kill@1,policy:0:send_weights:kill@2",
                     faults.FIRED_ENV: str(fired)})
    rc, out, pids = run_cli(["train", str(cfg), "--run-dir", str(cut)], env, cwd=REPO, timeout=400)
    left = leftovers(pids)
    assert rc == 0, out[-4000:]
    assert not left, f"processes left behind: {left}"
    assert sorted(p.name for p in fired.iterdir()) == ["policy-0-send_weights-kill-2", "rollout-0-generate-kill-1"]
    lost = [line for line in out.splitlines() if "worker lost (" in line]
    assert len(lost) == 2, out[-4000:]
    assert "worker lost (rollout:" in lost[0] and "restart 1 of 2" in lost[0] and "from step_000000" in lost[0]
    assert "worker lost (policy:" in lost[1] and "restart 2 of 2" in lost[1] and "from step_000000" in lost[1]
    assert out.index(lost[1]) < out.index("step 1/"), "the second loss came after the first step"
    rows = [r for r in metrics_rows(cut) if r["step"] >= 1]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and all(r["samples"] == PROMPTS * SAMPLES
                                                                          for r in rows), rows
    done = exactly_once(cut, ws.train, STEPS, PROMPTS)
    assert not (done.lost or done.twice or done.strays), done
    assert (done.steps_done, done.samples_seen) == (STEPS, STEPS * PROMPTS * SAMPLES)
    assert json.loads((cut / "summary.json").read_text())["restarts"] == 2
    guarantee("run.max_restarts recovers a worker lost before the first step and one lost during a recovery",
              "rollout SIGKILLed in the evaluation before step 1, policy SIGKILLed while that recovery synced "
              f"weights: 2 restarts from step 0, {STEPS} steps once each, {sum(done.trained.values())} prompts "
              "trained once, none lost")
