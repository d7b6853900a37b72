"""The training-worker skeleton (``rlweave.backend_helpers.training``) on two spawned gloo ranks
with a toy backend (``skeleton_scenarios.py``): uneven micro-batch counts run in lockstep and the
metrics add up over ranks; a NaN loss on one rank skips the step on every rank without touching
weights or the LR schedule; bad loss settings and a missing optimizer are refused by name;
offload on CPU counts the state's bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks

SCENARIOS = import_helper(Path(__file__).with_name("skeleton_scenarios.py"))


@pytest.fixture(scope="module")
def seen():
    return run_ranks(SCENARIOS.skeleton_scenario, 2, timeout_s=300)


def test_ranks_with_uneven_micro_batch_counts_step_together_and_metrics_add_up(seen):
    from rlweave.testing.scenarios.batches import fixed_batch

    first = seen["steps"][0]
    assert first["num_micro_batches"] == 4.0  # rank 0's 4 samples; rank 1 ran 2 empty micro-batches
    assert first["samples"] == 6.0 and first["tokens"] == float(fixed_batch().num_tokens)
    assert first["skipped"] == 0.0 and first["changed"] and first["scheduler_advanced"]
    assert first["loss"] == pytest.approx(first["nll"]) and first["loss"] > 0  # the token-mean over both ranks
    assert first["grad_norm"] > 0 and first["lr"] == pytest.approx(0.1)


def test_a_nan_loss_on_one_rank_skips_the_step_everywhere(seen):
    poisoned, after = seen["steps"][1], seen["steps"][2]
    assert poisoned["skipped"] == 1.0  # rank 0's own loss was finite
    assert not poisoned["changed"] and not poisoned["scheduler_advanced"]
    assert after["skipped"] == 0.0 and after["changed"] and after["scheduler_advanced"]
    assert after["loss"] < seen["steps"][0]["loss"]  # two applied updates lowered the loss
    assert seen["step_count"] == 3  # calls, the skipped one included


def test_bad_loss_settings_and_a_missing_optimizer_are_refused_by_name(seen):
    assert "toy backend: loss function TemperedLogprobSum has temperature 0.0" in seen["temperature_error"]
    assert "toy backend: role policy has no optimizer (roles.policy.optim unset)" in seen["no_optimizer_error"]


def test_offload_on_cpu_counts_the_state_and_onload_undoes_it(seen):
    off = seen["offload"]
    assert off["device"] == "cpu" and off["freed_bytes"] == 0 and off["moved_bytes"] == 0
    assert off["param_bytes"] + off["optim_bytes"] == seen["state_bytes"] and off["optim_bytes"] > 0
    assert seen["offloaded"] and seen["onload"] == {"loaded_bytes": 0}
