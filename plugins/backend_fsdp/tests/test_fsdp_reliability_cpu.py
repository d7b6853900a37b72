"""Failure guarantees of the FSDP backend on CPU over gloo: a NaN in one rank's loss skips the
step on every rank, non-finite state never reaches a checkpoint, and DCP checkpoints reload
bitwise across world sizes (2 -> 1 -> 2). Scenarios: reliability_scenarios.py beside this file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

tr = import_helper(Path(__file__).with_name("reliability_scenarios.py"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("fsdp_rel_tiny") / "model", seed=1))


@pytest.fixture(scope="module")
def nonfinite(tiny, tmp_path_factory):
    return run_ranks(tr.nonfinite_scenario, 2, tiny, str(tmp_path_factory.mktemp("fsdp_nonfinite")), timeout_s=600)


@pytest.fixture(scope="module")
def reshard(tiny, tmp_path_factory):
    work = tmp_path_factory.mktemp("fsdp_reshard")
    two, one = str(work / "saved_by_2"), str(work / "saved_by_1")
    return {"2": run_ranks(tr.reshard_scenario, 2, tiny, None, two, timeout_s=600),
            "2->1": run_ranks(tr.reshard_scenario, 1, tiny, two, one, timeout_s=600),
            "1->2": run_ranks(tr.reshard_scenario, 2, tiny, one, None, timeout_s=600)}


def test_nan_on_one_rank_skips_the_step_on_every_rank(nonfinite):
    assert [r["rank"] for r in nonfinite] == [0, 1]
    for r in nonfinite:
        grads, const = r["bad"]
        assert grads["skipped"] == 1.0 and math.isnan(grads["grad_norm"]) and math.isnan(grads["loss"])
        # a NaN added to rank 1's loss leaves the gradients finite: skipped all the same
        assert const["skipped"] == 1.0 and math.isfinite(const["grad_norm"]) and math.isnan(const["loss"])
        assert r["first"]["skipped"] == 0.0


def test_skipped_steps_leave_parameters_optimizer_state_and_lr_schedule_unchanged(nonfinite):
    for r in nonfinite:
        assert r["max_change"] == 0.0 and r["finite"]
        assert r["epochs"][0] == r["epochs"][1] == 1  # the LR schedule counts applied updates only
        assert r["bad"][0]["lr"] == r["bad"][1]["lr"] == r["next"]["lr"] > r["first"]["lr"]  # still in warm-up


def test_the_step_after_a_skipped_one_trains_as_if_none_was_skipped(nonfinite):
    for r in nonfinite:
        nxt, ref = r["next"], r["next_ref"]
        assert nxt["skipped"] == 0.0 and math.isfinite(nxt["loss"]) and nxt["loss"] < r["first"]["loss"]
        assert r["next_change"] > 0
        assert nxt["loss"] == ref["loss"] and nxt["grad_norm"] == ref["grad_norm"] and r["next_equal_ref"]


def test_checkpoint_of_non_finite_state_is_refused_on_every_rank(nonfinite):
    for r in nonfinite:
        for what, tensor in (("param", "parameter model.layers.1.mlp.down_proj.weight"),
                             ("optim", "optimizer state model.layers.1.mlp.down_proj.weight [exp_avg_sq]")):
            msg, written = r["saves"][what]
            assert msg is not None and not written, (what, msg)
            assert "role policy" in msg and f"called on rank {r['rank']}" in msg and f"rank 1: {tensor}" in msg
            assert "rank 0:" not in msg
        msg, written = r["saves"]["ok"]
        assert msg is None and written  # restored: saved


def _same_state(a: dict, b: dict) -> None:
    assert set(a["tensors"]) == set(b["tensors"]) and len(a["tensors"]) > 20
    for k, v in a["tensors"].items():
        w = b["tensors"][k]
        assert torch.is_tensor(v) and v.dtype == w.dtype and torch.equal(v, w), k
    assert any(k.endswith("/exp_avg_sq") for k in a["tensors"])
    assert a["param_groups"] == b["param_groups"] and a["scheduler"] == b["scheduler"] and a["step"] == b["step"] == 2


@pytest.mark.parametrize("direction", ["2->1", "1->2"])
def test_dcp_checkpoint_reloads_bitwise_on_another_world_size(reshard, direction):
    saved, loaded = reshard["2"], reshard[direction]
    _same_state(saved["state"], loaded["state"])
    a, b = saved["next"], loaded["next"]
    assert b["skipped"] == 0.0 and b["lr"] == a["lr"]
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)

