"""Chaos: real processes SIGKILLed at random moments in each run mode, and what must hold after.

One run per mode (``rlweave train`` in a subprocess, tiny fp32 GRPO on CPU, HF engine, FSDP
policy, a checkpoint every step): ``sync`` (long form only, :data:`LONG_ONLY`), ``one_step_off``,
``async``, ``partial`` (async with partial rollout) and ``multi_turn`` (episodes in
``one_step_off``). A seeded plan
(:func:`rlweave.testing.chaos.plan`) SIGKILLs, one after another, a rollout rank, a policy rank, a
reward worker or the controller itself (then ``rlweave train --resume``): at a random moment of the
next step or two once the run has logged two steps since the previous kill, or, for some kills
that follow a rank kill, at a random moment of that recovery (rebuild, checkpoint load, weight
sync). :mod:`rlweave.testing.chaos` has the exact windows. Afterwards:

* every prompt the run drew was trained exactly once in its epoch (the final checkpoint's data
  position, with the order rebuilt from its seed, minus what its queue holds untrained:
  ``steps x batch_size`` prompts, none twice, none lost), every step is logged once with all its
  samples, and the algorithm counted exactly those steps and samples;
* the staleness bound held in every step (``staleness/max``: 0 in sync mode, ``run.max_staleness``
  otherwise), those right after a restart or resume included;
* every checkpoint left verifies (checksums, its JSON state reads) and no incomplete one is left;
* each ``rollout``/``policy`` kill cost one restart (``run.max_restarts``), each controller kill
  one resume; no process of a killed controller outlived it by 15 s (Ray's two agents, which take
  60 s, see docs/reliability.md: by 75 s in the long form; the short form ends them itself), none of
  the run by 10 s.

The seed is printed with the plan and in every failure message; ``RLWEAVE_CHAOS_SEED=S`` replays
it (same targets, windows and order; the moments follow the run's own timing). Without it each
run draws a fresh seed. The short form here makes ``RLWEAVE_CHAOS_KILLS`` (default 2) kills over
4 steps a kill + 2 (``RLWEAVE_CHAOS_STEPS``); ``bench/reliability.py --chaos`` runs the long form
(``RLWEAVE_CHAOS_LONG=1``, more kills) and reads each run's figures from ``RLWEAVE_CHAOS_OUT``.

Windows the plan leaves out, because a run does not recover from them by itself
(docs/reliability.md): a worker lost while a process first builds its roles or writes its step-0
checkpoint, or after its last step (HF export); ``--resume`` continues such a run. A process's
setup and evaluation before its first step are recoverable
(``test_recovery_windows.py``) but not in the plan: kills wait for two logged steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlweave.testing import chaos
from rlweave.testing.runs import cli_env, metrics_rows

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PROMPTS, SAMPLES = 4, 4  # the workspace's batch_size and n_samples
KILLS_ENV, STEPS_ENV, OUT_ENV = "RLWEAVE_CHAOS_KILLS", "RLWEAVE_CHAOS_STEPS", "RLWEAVE_CHAOS_OUT"
#: "1": the long form (``bench/reliability.py --chaos``) also waits for Ray's agents of killed controllers
LONG_ENV = "RLWEAVE_CHAOS_LONG"


#: mode -> (config sections, staleness bound)
MODES = {
    "sync": ({}, 0),
    "one_step_off": ({"run": {"mode": "one_step_off"}, "algorithm": {"max_new_tokens": 6}}, 1),
    "async": ({"run": {"mode": "async", "max_staleness": 1}, "rollout": {"request_groups": 2},
               "algorithm": {"max_new_tokens": 6}}, 1),
    "partial": ({"run": {"mode": "async", "max_staleness": 1},
                 "rollout": {"partial": {"token_budget_per_step": 2, "max_rounds": 3}, "request_groups": 2},
                 "algorithm": {"max_new_tokens": 8}}, 1),
    "multi_turn": ({"run": {"mode": "one_step_off"},
                    "algorithm": {"max_new_tokens": 2,
                                  "multi_turn": {"env": {"name": "chaos_echo_env:Echo"}, "max_turns": 3,
                                                 "max_total_tokens": 64, "end_on_length": False}}}, 1),
}


def _steps_for(kills: int) -> int:
    """Enough steps for every kill: each waits for two steps and up to two more, and a recovery
    goes back at most one (a checkpoint every step); two more for steps that run faster than the
    ones a kill's delay was measured on (the first steps after a recovery are the slowest)."""
    return int(os.environ.get(STEPS_ENV) or 4 * kills + 4)


#: two xdist groups, so that ``make test``'s two workers share the runs (each builds the workspace once)
GROUPS = {"sync": "chaos_a", "one_step_off": "chaos_a", "multi_turn": "chaos_a", "async": "chaos_b",
          "partial": "chaos_b"}


#: modes the suite's short form leaves to the long one (``bench/reliability.py --chaos``): recovery in
#: sync mode is the suite's in test_lost_workers.py (rank kills, bitwise against an uninterrupted run),
#: test_recovery_windows.py and test_checkpoint_resume_equal.py (a controller killed during a save)
LONG_ONLY = {"sync"}


def _param(mode: str):
    marks = [pytest.mark.xdist_group(GROUPS[mode])]
    if mode in LONG_ONLY:
        why = "the long form's (RLWEAVE_CHAOS_LONG=1): the suite covers sync-mode recovery in test_lost_workers.py"
        marks.append(pytest.mark.skipif(os.environ.get(LONG_ENV) != "1", reason=why))
    return pytest.param(mode, marks=marks)


@pytest.mark.parametrize("mode", [_param(m) for m in sorted(MODES)])
def test_chaos_run_keeps_every_guarantee(grpo_workspace, guarantee, mode):
    ws = grpo_workspace
    (ws.root / "chaos_echo_env.py").write_text(chaos.ECHO_ENV)  # importable: cli_env puts ws.root on the path
    kills = int(os.environ.get(KILLS_ENV) or 2)
    long_form = os.environ.get(LONG_ENV) == "1"
    steps = _steps_for(kills)
    sections, bound = MODES[mode]
    seed = chaos.seed_from_env()
    plan = chaos.plan(seed, kills)
    print(f"[{mode}] chaos plan {plan} ({steps} steps; replay: {chaos.SEED_ENV}={seed})", flush=True)
    run = {"save_every": 1, "seed": 5, "max_restarts": max(1, plan.count(*chaos.RESTARTED)),
           **sections.get("run", {})}
    cfg = ws.config(f"chaos-{mode}", steps, run=run, roles={"rollout": {"timeouts": {"generate": 60}}},
                    **{k: v for k, v in sections.items() if k != "run"})
    run_dir = ws.root / "runs" / f"chaos-{mode}-{seed}"
    result = chaos.run_with_kills(cfg, run_dir, plan, steps, cli_env(ws.root), cwd=REPO, timeout=1800,
                                  wait_for_ray_agents=long_form)
    story = result.story()
    print(story, flush=True)
    problems = _problems(result, run_dir, ws.train, steps, bound)
    final = run_dir / "checkpoints" / f"step_{steps:06d}" / "state.json"
    done = chaos.exactly_once(run_dir, ws.train, steps, PROMPTS) if final.is_file() else None
    trained = sum(done.trained.values()) if done else 0
    targets = [m.kill.target + (" (in recovery)" if m.kill.in_recovery else "") for m in result.made]
    if os.environ.get(OUT_ENV):  # the long form's table (bench/reliability.py --chaos)
        row = {"mode": mode, "seed": seed, "kills": len(result.made), "targets": targets,
               "restarts": result.restarts, "resumes": result.resumes, "steps": steps, "prompts_trained": trained,
               "lost": done.lost if done else None, "trained_twice": len(done.twice) if done else None,
               "wall_s": round(result.wall_s, 1), "problems": problems}
        with open(os.environ[OUT_ENV], "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    if problems:
        pytest.fail(f"[{mode}] " + "\n".join(problems) + f"\n{story}\n--- last output ---\n"
                    f"{result.outputs[-1][-3000:]}", pytrace=False)
    after = sorted({s + 1 for s in result.continued_from if s + 1 <= steps})
    guarantee(f"chaos in {mode} mode: random kills survived, every prompt trained exactly once",
              f"seed {seed}: {len(result.made)} kills ({', '.join(targets)}) -> {result.restarts} restarts, "
              f"{result.resumes} resumes; {trained} prompts trained once, 0 lost, 0 twice; staleness <= {bound} in "
              f"all {steps} steps (steps {after} right after a recovery); checkpoints verify; no process left "
              f"({result.wall_s:.0f} s)")


def _problems(result: chaos.ChaosResult, run_dir: Path, train: Path, steps: int, bound: int) -> list[str]:
    """Every guarantee the chaos run broke, one line each (empty: none)."""
    out = []
    if result.exit_codes[-1] != 0:
        out.append(f"the run ended with exit code {result.exit_codes[-1]}")
    if result.not_made:
        out.append(f"{len(result.not_made)} planned kill(s) not made: the run ended first")
    ranks = sum(m.kill.target in chaos.RESTARTED for m in result.made)
    controllers = sum(m.kill.target == "controller" for m in result.made)
    if result.restarts != ranks or result.resumes != controllers:
        out.append(f"{result.restarts} restarts and {result.resumes} resumes for {ranks} rank kills and "
                   f"{controllers} controller kills")
    if result.controller_leftovers or result.leftovers:
        out.append(f"processes left behind: killed controllers' {result.controller_leftovers}, "
                   f"the run's {result.leftovers}")
    if result.exit_codes[-1] != 0 or not (run_dir / "checkpoints" / f"step_{steps:06d}").is_dir():
        return out
    rows = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        out.append(f"steps logged {[r['step'] for r in rows]}, expected each of 1..{steps} once")
    if any(r["samples"] != PROMPTS * SAMPLES for r in rows):
        out.append(f"samples per step {[r['samples'] for r in rows]}, expected {PROMPTS * SAMPLES}")
    done = chaos.exactly_once(run_dir, train, steps, PROMPTS)
    if done.strays or done.twice or done.lost or len(done.drawn) != len(set(done.drawn)):
        out.append(f"prompts: {done.lost} lost, trained twice {done.twice}, queued never drawn {done.strays}")
    if done.steps_done != steps or done.samples_seen != steps * PROMPTS * SAMPLES:
        out.append(f"algorithm state: steps_done {done.steps_done}, samples_seen {done.samples_seen}")
    stale = chaos.staleness_violations(run_dir, bound)
    if stale:
        out.append(f"staleness bound {bound} broken at (step, staleness/max) {stale}")
    damaged = chaos.damaged_checkpoints(run_dir)
    if damaged:
        out.append(f"damaged checkpoints: {damaged}")
    return out
