"""GRPO (also with ReMax's greedy baseline), PPO and OnlineDPO with multi-turn episodes through
``rlweave train`` (in process: FSDP workers, HF engine): an environment given as
``path/to/file.py:Class`` answers every model turn until its third, each algorithm trains the
model's tokens of every turn through the rollout seam, the episode metrics are written, and nothing
is left running. PPO runs in ``one_step_off`` (the next step's episodes run while a step trains),
and so does a GRPO run whose checkpoint holds the records drawn ahead."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
ENV = f"{Path(__file__).with_name('multi_turn_scenarios.py')}:Countdown"
EPISODES = {"multi_turn": {"env": {"name": ENV}, "max_turns": 3, "max_total_tokens": 40, "end_on_length": False}}
#: what each algorithm adds to the workspace's GRPO config, and the metric that shows it updated
ALGORITHMS = {  # GRPO with the default estimator: test_one_step_off_runs_the_next_steps_episodes_while_a_step_trains
    "remax": ({"advantage": "remax"}, {}, "reward/greedy_mean"),  # its baseline: a greedy episode per prompt
    "ppo": ({"name": "ppo", "reward_models": [], "kl": {"beta": 0.0}},
            {"critic": {"backend": "fsdp", "devices": 1, "optim": {"lr": 2.0e-2}}},
            "value_loss"),
    "online_dpo": ({"name": "online_dpo"}, {"reference": {"backend": "fsdp", "devices": 1}}, "pairs"),
}


#: the run section each algorithm's run adds (PPO's episodes run one step ahead)
RUN = {"ppo": {"mode": "one_step_off"}}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_each_algorithm_trains_on_multi_turn_episodes(grpo_workspace, algo):
    ws = grpo_workspace
    algorithm, roles, updated = ALGORITHMS[algo]
    if "critic" in roles:  # a role's own model section names its path
        roles = {"critic": {**roles["critic"], "model": {"path": str(ws.model), "model_type": "value"}}}
    cfg = ws.config(f"multi-turn-{algo}", 2, run={"scheduler": "in_process", **RUN.get(algo, {})},
                    resources={"pools": {"default": {"devices_per_node": 3}}}, roles=roles,
                    algorithm={**EPISODES, **algorithm})
    rc, out, pids = run_cli(["train", str(cfg)], cli_env())
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / f"multi-turn-{algo}"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert len(steps) == 2
    for r in steps:
        assert r["episode/turns_mean"] > 1.5 and r["episode/tool_calls_mean"] > 0.5, r
        assert 0 <= r["episode/limit_frac"] <= 1
        assert r["response_len/mean"] > r["episode/turns_mean"]  # observations are part of the episode
        assert torch.isfinite(torch.tensor(r.get("loss", 0.0)))
    assert any(r.get(updated, 0) > 0 for r in steps), steps
    if RUN.get(algo, {}).get("mode") == "one_step_off":  # the second step trained episodes of the first weights
        assert [r["staleness/max"] for r in steps] == [0.0, 1.0], steps
    summary = json.loads((run_dir / "summary.json").read_text())  # held-out evaluation ran episodes too
    assert summary["eval_after"]["eval/tool_used_frac"] > 0, summary
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not leftovers(pids)


def test_multi_turn_config_errors_come_before_any_worker(grpo_workspace):
    ws = grpo_workspace
    cfg = ws.config("mt-bad", 1, algorithm={"multi_turn": {"env": {"name": "tools", "args": {"tools": []}}}})
    rc, out, _ = run_cli(["validate", str(cfg)], cli_env())
    assert rc != 0 and "algorithm.multi_turn.env" in out and "tools" in out, out[-2000:]
    for algo in ("grpo", "ppo"):  # episodes run one step ahead or in rounds, not asynchronously
        cfg = ws.config("mt-mode", 1, run={"mode": "async"}, algorithm={"multi_turn": {"env": {"name": ENV}},
                                                                        "name": algo, **ALGORITHMS.get(algo, ({},))[0]})
        rc, out, _ = run_cli(["validate", str(cfg)], cli_env())
        assert rc != 0 and "'async'" in out and algo in out, out[-2000:]
    # ReMax's greedy baseline needs sync steps of whole episodes
    cfg = ws.config("mt-remax", 1, rollout={"partial": {"token_budget_per_step": 4}},
                    algorithm={"multi_turn": {"env": {"name": ENV}}, "advantage": "remax"})
    rc, out, _ = run_cli(["validate", str(cfg)], cli_env())
    assert rc != 0 and "rollout.partial" in out, out[-2000:]


def test_one_step_off_runs_the_next_steps_episodes_while_a_step_trains(grpo_workspace):
    """GRPO in ``one_step_off`` with episodes: the first step trains episodes of the current
    weights, every later one episodes of the weights one update old; the episode metrics are
    written and the held-out evaluation runs episodes; the final checkpoint holds the records
    drawn ahead and not trained, which the data position already counts."""
    ws = grpo_workspace
    cfg = ws.config("mt-off", 3, run={"scheduler": "in_process", "mode": "one_step_off", "save_every": 3},
                    algorithm=EPISODES)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env())
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "mt-off"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["staleness/max"] for r in steps] == [0.0, 1.0, 1.0], steps
    for r in steps:
        assert r["samples"] == 16.0 and r["episode/turns_mean"] > 1.5 and r["episode/tool_calls_mean"] > 0.5, r
        assert 0 <= r["episode/limit_frac"] <= 1 and r["response_len/mean"] > r["episode/turns_mean"], r
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after"]["eval/tool_used_frac"] > 0, summary
    # a sync asked for by a step is applied when the next episodes start (the last one's: before the checkpoint)
    assert [r["time/sync"] > 0 for r in steps] == [True, True, False], steps
    state = json.loads((run_dir / "checkpoints" / "step_000003" / "state.json").read_text())
    ahead = state["algorithm"]["pipeline"]["records"]
    assert [len(b) for b in ahead] == [4], ahead
    assert state["data"]["position"] == 4 * 3 + 4
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not leftovers(pids)


def test_partial_rollout_cuts_episodes_and_continues_them_in_later_rounds(grpo_workspace):
    """GRPO in ``one_step_off`` with partial rollout of episodes (2 model tokens per round, the
    third round unbudgeted, staleness bound 2): every trained episode took several rounds, groups
    complete beyond a step's need wait for the next one (their tokens two versions old, within
    the bound), and the checkpoint holds every record drawn and not trained."""
    ws = grpo_workspace
    cfg = ws.config("mt-partial", 3, run={"scheduler": "in_process", "mode": "one_step_off", "max_staleness": 2,
                                          "save_every": 3},
                    rollout={"partial": {"token_budget_per_step": 2, "max_rounds": 3}}, algorithm=EPISODES)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env())
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "mt-partial"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert len(steps) == 3
    for r in steps:
        assert r["samples"] == 16.0 and r["episode/turns_mean"] > 1.5, r
        assert r["partial/ratio"] > 0.5 and r["partial/rounds"] >= 1 and r["staleness/max"] <= 2.0, r
    assert max(r["staleness/max"] for r in steps) >= 1.0, steps
    state = json.loads((run_dir / "checkpoints" / "step_000003" / "state.json").read_text())
    kept = [rec for b in state["algorithm"]["pipeline"]["records"] for rec in b]
    assert len(kept) == state["data"]["position"] - 3 * 4, state  # drawn = trained + kept
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not leftovers(pids)


def test_a_run_killed_during_episodes_resumes_like_an_uninterrupted_one(grpo_workspace, tmp_path):
    """SIGKILL while step 2's episodes are under way (environment steps done, none of the step
    trained), then ``--resume``: the run continues from the step-1 checkpoint and ends with the
    weights and step metrics of a run that was never stopped, so no episode was lost or trained
    twice. Lock-step turns keep the engine calls, and so the samples, the same in both runs."""
    ws = grpo_workspace
    marks = tmp_path / "marks"
    env = cli_env(MT_MARKS=str(marks))
    episodes = {**EPISODES, "multi_turn": {**EPISODES["multi_turn"], "scheduling": "lockstep",
                                           "env": {"name": ENV.replace(":Countdown", ":Marked")}}}
    cfg = ws.config("mt-resume", 3, run={"scheduler": "in_process", "save_every": 1}, algorithm=episodes)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    rc, out, pids = run_cli(["train", str(cfg), "--run-dir", str(straight)], env)
    assert rc == 0, out[-4000:]
    at_save: list[int] = []

    def in_step_two() -> bool:
        if not (cut / "checkpoints" / "step_000001" / "COMPLETE").exists():
            return False
        n = marks.read_text().count("\n")
        at_save.append(n)
        return n >= at_save[0] + 8  # eight environment steps into step 2

    rc, out, killed = run_cli(["train", str(cfg), "--run-dir", str(cut)], env, kill_when=in_step_two)
    assert rc == -signal.SIGKILL, out[-4000:]
    assert sorted(r["step"] for r in metrics_rows(cut) if r["step"] >= 1) == [1]  # step 2 never trained
    rc, out, more = run_cli(["train", str(cfg), "--resume", "--run-dir", str(cut)], env)
    assert rc == 0 and "resumed from" in out, out[-4000:]
    assert not leftovers(pids | killed | more)

    def rows(d):
        return {r["step"]: {k: v for k, v in r.items() if k.startswith(("episode/", "reward/", "response_len/"))
                            or k in ("loss", "samples", "grad_norm")}
                for r in metrics_rows(d) if r["step"] >= 1}

    assert sorted(r["step"] for r in metrics_rows(cut) if r["step"] >= 1) == [1, 2, 3]  # each step once
    assert rows(cut) == rows(straight)
    a, b = load_file(straight / "hf" / "model.safetensors"), load_file(cut / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rewards_overlapped_with_episodes_train_as_rewards_scored_after_them(grpo_workspace, tmp_path):
    """GRPO with rule rewards and a reward model on episodes (those of half of the records end after
    one turn, the others after three), ``reward_overlap`` on (default) and off: each record's group
    is scored while the other records' episodes run, with the step's reward time split into
    ``time/reward/overlapped`` and ``time/reward/wait`` (rules) and ``time/reward/models_overlapped``
    and ``time/reward/models_wait`` (the reward model). Every sample gets the reward of scoring the
    batch after all episodes (the dumped rewards: the rules' exactly, the reward model's up to the
    last bits of a forward pass over another packing) and the runs train alike. Lock-step turns keep
    the engine calls, and so the samples, the same in both runs."""
    from safetensors import safe_open

    ws = grpo_workspace
    runs, dumps = {}, {}
    reward_role = {"reward": {"backend": "fsdp", "devices": 1,
                              "model": {"path": str(ws.model), "model_type": "reward"}}}
    for overlap in (True, False):
        episodes = {"multi_turn": {**EPISODES["multi_turn"], "scheduling": "lockstep", "reward_overlap": overlap,
                                   "env": {"name": ENV.replace(":Countdown", ":Staggered")}},
                    "reward_models": [{"role": "reward", "weight": 0.5}]}
        cfg = ws.config(f"mt-overlap-{overlap}", 2, run={"scheduler": "in_process"}, algorithm=episodes,
                        roles=reward_role, resources={"pools": {"default": {"devices_per_node": 3}}},
                        rollout={"dump": True})
        rc, out, pids = run_cli(["train", str(cfg), "--run-dir", str(tmp_path / str(overlap))], cli_env())
        assert rc == 0, out[-4000:]
        assert not leftovers(pids)
        runs[overlap] = [r for r in metrics_rows(tmp_path / str(overlap)) if r["step"] >= 1]
        dumps[overlap] = []
        for step in (1, 2):
            with safe_open(tmp_path / str(overlap) / "rollouts" / f"step_{step:06d}.safetensors", "pt") as f:
                events = json.loads(f.metadata()["rlweave"])["events"]
                dumps[overlap].append((f.get_tensor("1.scores"), events[1]["breakdown"]))
    for r in runs[True]:
        assert r["time/reward/overlapped"] >= 0 and r["time/reward/wait"] >= 0, r
        assert r["time/reward/models_overlapped"] >= 0 and r["time/reward/models_wait"] >= 0, r
    # groups whose episodes ended after one turn were scored while the others ran
    assert any(r["time/reward/overlapped"] > 0 and r["time/reward/models_overlapped"] > 0 for r in runs[True]), runs
    assert all("time/reward/overlapped" not in r and "time/reward/models_overlapped" not in r for r in runs[False])
    for (early, rules_early), (after, rules_after) in zip(dumps[True], dumps[False]):
        assert rules_early == rules_after  # each sample's rule rewards, exactly
        assert torch.allclose(early, after, rtol=0, atol=1e-6), (early, after)

    def trained(rows):
        return [{k: v for k, v in r.items() if k.startswith(("reward/", "episode/", "response_len/"))
                 or k in ("loss", "samples", "grad_norm")} for r in rows]

    assert len(runs[True]) == 2
    for a, b in zip(trained(runs[True]), trained(runs[False])):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-6) for k in a), (a, b)
        assert all(a[k] == b[k] for k in a if k.startswith(("reward/rules", "reward/arith", "episode/")))
    a, b = (load_file(tmp_path / str(o) / "hf" / "model.safetensors") for o in (True, False))  # Adam: lr-sized steps
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-4) for k in a)
