"""End-to-end GRPO through ``rlweave train`` with the policy on the megatron backend at TP=2
(two Ray ranks over gloo), the HF engine generating with the weights streamed from it after
every step, a distributed checkpoint and the Hugging Face export at the end. (Resuming a
megatron checkpoint in any layout is proven on the workers in
``plugins/backend_megatron/tests/test_megatron_cpu.py``; ``--resume`` itself is the runner's, the
same for every backend.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytest.importorskip("megatron.core", reason="megatron-core not installed")
pytestmark = pytest.mark.slow


def test_grpo_with_a_tensor_parallel_megatron_policy_trains_syncs_and_saves(grpo_workspace, tmp_path):
    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("arith_build_model", repo / "examples/arith/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build(tmp_path / "model", tmp_path / "no-data", hidden=64, layers=2, heads=2, kv_heads=2, ffn=64,
                      max_positions=64)
    ws = grpo_workspace
    sections = dict(
        run={"save_every": 2},
        model={"path": str(model), "dtype": "float32"},
        resources={"pools": {"default": {"devices_per_node": 3}}},
        roles={"policy": {"backend": "megatron", "devices": 2, "parallel": {"tp": 2},
                          "options": {"make_vocab_size_divisible_by": 1}, "optim": {"lr": 2.0e-2}}})
    rc, out, pids = run_cli(["train", str(ws.config("mg", 2, **sections))], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "mg"
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "roles" / "policy" / ".metadata").is_file()
    assert (run_dir / "hf" / "config.json").is_file()
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["samples"] == 16.0, r
    assert pids and not leftovers(pids)
