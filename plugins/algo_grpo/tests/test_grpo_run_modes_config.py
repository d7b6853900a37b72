"""Run modes and partial rollout at validation: what GRPO accepts, and the errors (with their
dotted paths) for what it cannot run, reported before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config

ROOT = Path(__file__).resolve().parents[3]
GRPO = ROOT / "examples/arith/grpo.yaml"
PPO = ROOT / "examples/arith/ppo.yaml"
ONLINE_DPO = ROOT / "examples/arith/online_dpo.yaml"


def issues(path: Path, overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides, check_inputs=False)
    return {i.path: i.message for i in exc.value.issues}


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_grpo_accepts_every_mode_with_partial_rollout(mode):
    cfg, _ = load_config(GRPO, [f"run.mode={mode}", "rollout.partial.token_budget_per_step=3",
                                "rollout.partial.max_rounds=2"], check_inputs=False)
    assert cfg.run.mode == mode and cfg.rollout.partial.token_budget_per_step == 3


def test_modes_an_algorithm_does_not_implement_are_refused():
    found = issues(ONLINE_DPO, ["run.mode=async", "rollout.partial.token_budget_per_step=3"])
    assert "runs in mode(s) sync, not 'async'" in found["run.mode"]
    assert "does not implement partial rollout" in found["rollout.partial"]
    # PPO runs every mode, but ppo.yaml shares the devices between the rollout and the trainers
    found = issues(PPO, ["run.mode=async", "rollout.partial.token_budget_per_step=3"])
    assert set(found) == {"resources.colocate"} and "colocated with" in found["resources.colocate"]
    found = issues(GRPO, ["run.mode=async", "algorithm.dynamic_sampling=true"])
    assert "runs in mode(s) sync" in found["run.mode"]
    # ReMax generates a greedy baseline with each batch: sync steps only
    found = issues(GRPO, ["run.mode=one_step_off", "algorithm.advantage=remax"])
    assert "runs in mode(s) sync, not 'one_step_off'" in found["run.mode"]


def test_overlapping_modes_need_an_engine_that_stays_up():
    found = issues(GRPO, ["run.mode=one_step_off", "run.max_staleness=0", "resources.offload=always"])
    assert "max_staleness >= 1" in found["run.max_staleness"]
    assert "cannot be put away" in found["resources.offload"]
    found = issues(GRPO, ["rollout.partial.token_budget_per_step=0"])
    assert "rollout.partial.token_budget_per_step" in found


TOOLS = ROOT / "examples/tools/grpo.yaml"


def test_run_modes_and_rollouts_are_named_plugins_checked_before_any_worker():
    found = issues(GRPO, ["run.mode=eventually"])
    assert "unknown run mode 'eventually'" in found["run.mode"] and "one_step_off" in found["run.mode"]
    found = issues(GRPO, ["rollout.name=nonesuch"])
    assert "unknown rollout 'nonesuch'" in found["rollout.name"] and "single_turn" in found["rollout.name"]
    found = issues(GRPO, ["rollout.name=multi_turn"])
    assert "configured by algorithm.multi_turn" in found["rollout.name"]
    found = issues(GRPO, ["rollout.args.hint=x"])  # the single-turn rollout takes no settings
    assert "rollout.args" in " ".join(found)
    found = issues(TOOLS, ["rollout.args.max_turns=2"])
    assert "algorithm.multi_turn" in found["rollout.args"]
    found = issues(TOOLS, ["run.mode=async"])
    assert "rollout 'multi_turn' does not stream its generation" in found["run.mode"]


def test_the_resolved_config_names_the_rollout_and_run_mode():
    cfg, resolved = load_config(TOOLS, ["run.mode=one_step_off"], check_inputs=False)
    assert (resolved.rollout.name, resolved.rollout.resumable, resolved.run_mode.name) == ("multi_turn", True,
                                                                                           "one_step_off")
    cfg, resolved = load_config(GRPO, [], check_inputs=False)
    assert (resolved.rollout.name, resolved.rollout.streams, cfg.rollout.name) == ("single_turn", True, None)
