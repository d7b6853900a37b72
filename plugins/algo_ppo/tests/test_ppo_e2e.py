"""PPO end to end through the real runner (Ray, FSDP backend, transformers engine) on a tiny
model with all five roles colocated: the critic's worker killed mid-step is reported by role
and rank, rebuilt (``run.max_restarts``), and the run continues from the last complete
checkpoint to its end."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def _build_model(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("arith_build_model_ppo", REPO / "examples/arith/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(out, out / "no-data", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, max_positions=64)


def _config(tmp: Path, model: Path, steps: int, max_restarts: int = 0):
    from rlweave.config.loader import load_config

    cfg = {
        "run": {"name": "ppo-kill", "output_dir": str(tmp / "runs"), "seed": 3, "total_steps": steps,
                "save_every": 2, "keep_last": 2, "max_restarts": max_restarts},
        "ray": {"num_cpus": 2},
        "model": {"path": str(model), "dtype": "float32"},
        "resources": {"pools": {"default": {"devices_per_node": 1}},
                      "colocate": [["policy", "rollout", "reference", "critic", "reward"]]},
        "roles": {
            "policy": {"backend": "fsdp", "optim": {"lr": 1.0e-3}},
            "rollout": {"engine": "hf"},
            "reference": {"backend": "fsdp"},
            "critic": {"backend": "fsdp", "model": {"path": str(model), "model_type": "value"}, "optim": {"lr": 1.0e-3}},
            "reward": {"backend": "fsdp", "model": {"path": str(model), "model_type": "reward"}},
        },
        "algorithm": {"name": "ppo", "n_samples": 2, "max_new_tokens": 3, "eval_reward": "arith_exact",
                      "eval_max_new_tokens": 3},
        "data": {"train": str(tmp / "train.jsonl"), "eval": str(tmp / "test.jsonl"), "batch_size": 4},
    }
    path = tmp / "ppo.yaml"
    path.write_text(json.dumps(cfg))
    return load_config(path)[0]


def test_killed_critic_is_named_rebuilt_and_the_run_continues(tmp_path, monkeypatch, capsys):
    from rlweave.runner.loop import run
    from rlweave_algo_ppo.algorithm import PPO

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    model = _build_model(tmp_path / "model")
    train = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(6) for b in range(6)]
    test = [{"prompt": f"{a}-{b}=", "answer": a - b} for a in range(3, 6) for b in range(3)]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _config(tmp_path, model, steps=4, max_restarts=1)
    run_dir = tmp_path / "runs" / "ppo-kill"

    killed: list[int] = []
    original = PPO._update

    def kill_critic_then_continue(self, batch, train_policy):
        if self.steps_done == 2 and not killed:  # step 3, after the step-2 checkpoint
            (info,) = self.ctx.roles["critic"].ping().result()
            os.kill(info["pid"], signal.SIGKILL)
            killed.append(info["pid"])
        return original(self, batch, train_policy)

    monkeypatch.setattr(PPO, "_update", kill_critic_then_continue)
    summary = run(cfg, run_dir=run_dir)
    assert killed, "the critic was never killed"
    out = capsys.readouterr().out
    lost = [line for line in out.splitlines() if "worker lost (" in line]
    assert len(lost) == 1 and "worker lost (critic: rank 0 " in lost[0], out[-3000:]
    assert "continuing from step_000002" in lost[0], lost
    assert summary["restarts"] == 1 and summary["steps"] == 4
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] >= 1] == [1, 2, 3, 4]  # step 3 logged once, after the restart
    assert all("value_loss" in r for r in rows if r["step"] >= 1)
    assert summary["eval_after"] is not None and "eval/accuracy" in summary["eval_after"]
    assert (run_dir / "checkpoints" / "step_000004").is_dir()
