"""GRPO through ``rlweave train`` with the policy on 2 ranks in one Ulysses sequence-parallel
group (``parallel: {sp: 2}``; the model's single key/value head is repeated) runs to the end on
CPU, and its first step trains on the same rollouts with the same loss as the policy on one
rank (that run with ``run.scheduler: in_process``)."""

from __future__ import annotations

import math

import pytest

from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow


def test_grpo_with_sequence_parallel_policy(grpo_workspace):
    ws = grpo_workspace
    pools = {"pools": {"default": {"devices_per_node": 3}}}
    sp = ws.config("sp2", 2, resources=pools,
                   roles={"policy": {"devices": 2, "parallel": {"sp": 2},
                                     "options": {"max_tokens_per_micro_batch": 24}}})
    one = ws.config("sp1", 1, resources=pools, roles={"policy": {"options": {"max_tokens_per_micro_batch": 24}}},
                    run={"scheduler": "in_process"})  # the one-rank reference needs no Ray
    rows = {}
    for name, cfg in (("sp2", sp), ("sp1", one)):
        rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root))
        assert rc == 0, out[-4000:]
        assert pids and not leftovers(pids)
        rows[name] = {r["step"]: r for r in metrics_rows(ws.root / "runs" / name)}
    assert sorted(s for s in rows["sp2"] if s >= 1) == [1, 2]
    for r in (rows["sp2"][1], rows["sp2"][2]):
        for key in ("loss", "entropy", "grad_norm", "reward/mean"):
            assert math.isfinite(r[key]), (key, r)
    first, ref = rows["sp2"][1], rows["sp1"][1]
    assert first["reward/mean"] == ref["reward/mean"]
    for key in ("loss", "entropy", "grad_norm"):
        assert first[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (key, first[key], ref[key])
    assert (ws.root / "runs" / "sp2" / "hf" / "model.safetensors").exists()
