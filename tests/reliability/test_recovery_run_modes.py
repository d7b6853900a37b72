"""Recovery (``run.max_restarts``) in the overlapping run modes trains every drawn prompt
exactly once (``rlweave train`` in a subprocess, tiny fp32 GRPO on CPU, HF engine, FSDP policy).

One run per mode, 4 steps with a checkpoint every step; the policy's only rank SIGKILLs itself in
its third ``train_step`` (step 3), the run goes back to step 2's checkpoint and finishes. In the
final checkpoint (step 4), with the data order rebuilt from its saved seed:

* every record drawn from the data (the first ``position`` of the epoch's order) is either trained
  or held in the checkpoint's queue (drawn, not yet trained: ``one_step_off``'s prefetched batch,
  ``async``'s groups with their partial samples), never both;
* the trained ones are 4 steps x 4 prompts, each once, and ``samples_seen`` is 4 x 16: a prompt
  trained twice, or one lost in the restart, breaks one of the two.

Modes: ``one_step_off``; ``async`` with partial rollout (responses cut at a per-step token budget
and continued, so the queue holds half-generated samples when a checkpoint is written); multi-turn
episodes (an environment answering every model turn, up to 3 turns) in ``one_step_off``, whose
episode pipeline holds the prefetched record batch.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from rlweave.scheduler import faults
from rlweave.testing.chaos import ECHO_ENV, drawn_ids, queued_ids
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, SAMPLES = 4, 4, 4  # the workspace's batch_size and n_samples

MODES = {
    "one_step_off": {"run": {"mode": "one_step_off"}, "algorithm": {"max_new_tokens": 6}},
    "async_partial": {"run": {"mode": "async", "max_staleness": 1},
                      "rollout": {"partial": {"token_budget_per_step": 2, "max_rounds": 3}, "request_groups": 2},
                      "algorithm": {"max_new_tokens": 8}},
    "multi_turn": {"run": {"mode": "one_step_off"},
                   "algorithm": {"max_new_tokens": 2,
                                 "multi_turn": {"env": {"name": "recovery_echo_env:Echo"}, "max_turns": 3,
                                                "max_total_tokens": 64, "end_on_length": False}}},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_recovery_trains_every_drawn_prompt_exactly_once(grpo_workspace, guarantee, mode):
    ws = grpo_workspace
    (ws.root / "recovery_echo_env.py").write_text(ECHO_ENV)  # importable: cli_env puts ws.root on the path
    sections = MODES[mode]
    run = {"save_every": 1, "max_restarts": 1, **sections["run"]}
    cfg = ws.config(f"modes-{mode}", STEPS, run=run, **{k: v for k, v in sections.items() if k != "run"})
    run_dir = ws.root / "runs" / f"modes-{mode}"
    t0 = time.monotonic()
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root, **{faults.ENV: "policy:0:train_step:kill@3"}),
                            cwd=REPO, timeout=400)
    took = time.monotonic() - t0
    left = leftovers(pids)
    assert rc == 0, out[-4000:]
    assert not left, f"processes left behind: {left}"
    lost = [line for line in out.splitlines() if "worker lost (" in line]
    assert len(lost) == 1 and "worker lost (policy:" in lost[0] and "from step_000002" in lost[0], lost or out[-3000:]
    rows = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step once
    assert all(r["samples"] == PROMPTS * SAMPLES for r in rows), [r["samples"] for r in rows]
    if "multi_turn" in sections["algorithm"]:
        assert all(r["episode/turns_mean"] > 1 for r in rows), [r["episode/turns_mean"] for r in rows]

    state = json.loads((run_dir / "checkpoints" / f"step_{STEPS:06d}" / "state.json").read_text())
    algo = state["algorithm"]
    drawn = drawn_ids(ws.train, state["data"])
    queued = queued_ids(algo.get("pipeline") or {})
    assert not set(queued) - set(drawn), f"queued records never drawn: {set(queued) - set(drawn)}"
    trained = Counter(drawn) - Counter(queued)
    assert sum(trained.values()) == STEPS * PROMPTS and max(trained.values()) == 1, (trained, queued)
    assert len(drawn) == len(set(drawn))  # one epoch: no record drawn twice
    assert algo["steps_done"] == STEPS and algo["samples_seen"] == STEPS * PROMPTS * SAMPLES, algo
    guarantee(f"recovery in {mode} mode trains every drawn prompt exactly once",
              f"policy rank SIGKILLed in step 3, back to step 2: {len(drawn)} drawn = {STEPS * PROMPTS} trained once "
              f"+ {len(queued)} queued, {STEPS} steps of {PROMPTS * SAMPLES} samples ({took:.0f} s)")
