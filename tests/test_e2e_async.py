"""End-to-end GRPO in the overlapping run modes and with partial rollout, through
``rlweave train`` on a tiny model (HF engine, FSDP backend, Ray, object-store weight sync).

* ``one_step_off``: every step after the first trains samples at most one version old (older
  samples trained, fresher ones when a weight load overtook a queued generate call), and some are;
  its timeline (``trace.json``) has spans of every role and shows generation overlapping training;
  the ranks' own output is in ``logs/<role>-<rank>.log``, not on the console;
* ``async`` + partial rollout: no trained token is older than ``run.max_staleness``, samples
  cut at the token budget are continued (``partial/ratio`` > 0), and the checkpoint holds the
  queue (records drawn but not trained, partial samples) that ``--resume`` restores;
* a run resumed from that checkpoint trains on from the queue it saved.
"""

from __future__ import annotations

import json

import pytest

from rlweave.testing.runs import cli_env, console_problems, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow


def _steps(run_dir):
    return [r for r in metrics_rows(run_dir) if r["step"] >= 1]


def test_one_step_off_trains_one_version_old_samples(grpo_workspace):
    ws = grpo_workspace
    cfg = ws.config("off", 5, run={"mode": "one_step_off"}, algorithm={"max_new_tokens": 6})
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "off"
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert steps[0]["staleness/max"] == 0.0
    # at most one version old: fresher where a weight load reached the engine (its control plane) ahead of a
    # generate call still queued there; and the mode did train one-version-old samples
    for r in steps[1:]:
        assert 0.0 <= r["staleness/mean"] <= r["staleness/max"] <= 1.0, r
        assert r["samples"] == 16.0
    assert max(r["staleness/max"] for r in steps[1:]) == 1.0
    assert pids and not leftovers(pids)
    _timeline_shows_the_overlap(run_dir, out)
    # every rank's own output is in the run's logs, none of it on the console
    for role in ("policy", "rollout"):
        assert (run_dir / "logs" / f"{role}-0.log").is_file(), role
    assert not console_problems(out), (console_problems(out), out[-3000:])


def _timeline_shows_the_overlap(run_dir, out):
    """trace.json is Chrome trace JSON with spans of every role (and the controller's steps), and
    in one_step_off the engine generates while the policy trains: a ``generate`` span of the
    rollout role overlaps a ``train_step`` span of the policy by a good part of the shorter one."""
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [dict(e, track=names[e["pid"]]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and "step" in e["args"] and "policy_version" in e["args"] for e in spans)
    assert max(e["args"]["policy_version"] for e in spans) == 5  # the weight version, one per update
    roles = set(json.loads((run_dir / "workers.json").read_text()))
    tracks = {e["track"] for e in spans}
    assert roles | {"controller", "rewards"} <= tracks, (roles, tracks)  # the reward pool's scoring too
    steps = [e for e in spans if e["track"] == "controller" and e["name"] == "step" and e["tid"] == 1]
    assert sorted(e["args"]["step"] for e in steps) == [1, 2, 3, 4, 5]
    gens = [e for e in spans if e["track"] == "rollout" and e["name"] == "generate"]
    trains = [e for e in spans if e["track"] == "policy" and e["name"] == "train_step"]
    assert gens and trains

    def overlap(a, b):
        return min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"])

    assert any(overlap(g, t) > 0.5 * min(g["dur"], t["dur"]) for g in gens for t in trains)
    assert (run_dir / "timeline.png").stat().st_size > 1000 and f"timeline: {run_dir / 'timeline.png'}" in out


def test_async_partial_rollout_and_resume(grpo_workspace):
    ws = grpo_workspace
    sections = dict(run={"mode": "async", "max_staleness": 1, "save_every": 2},
                    rollout={"partial": {"token_budget_per_step": 2, "max_rounds": 3}, "request_groups": 2},
                    algorithm={"max_new_tokens": 8, "off_policy": {"correction": "tis", "cap": 1.5}})
    rc, out, pids = run_cli(["train", str(ws.config("async", 2, **sections))], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "async"
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "state.json").read_text())
    queue = state["algorithm"]["pipeline"]["groups"]
    assert queue, "the checkpoint holds the records drawn but not trained"
    assert state["data"]["position"] == 4 * 2 + len(queue)
    assert pids and not leftovers(pids)

    # the same run resumed and taken to 4 steps: the saved queue is trained first
    rc, out, pids = run_cli(["train", str(ws.config("async", 4, **sections)), "--resume"], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["staleness/max"] <= 1.0, r
        assert r["samples"] == 16.0
        for key in ("time/idle/policy", "time/idle/rollout", "queue/groups", "partial/ratio", "offpolicy/iw_mean",
                    "offpolicy/truncated_frac"):
            assert key in r, key
        assert r["offpolicy/iw_max"] >= r["offpolicy/iw_mean"] >= r["offpolicy/iw_min"] > 0
    assert any(r["partial/ratio"] > 0 for r in steps), "samples cut at the budget were continued"
    assert pids and not leftovers(pids)
