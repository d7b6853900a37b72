"""PPO end to end through the real runner (Ray, FSDP backend, transformers engine) on a tiny
model: killing the critic's worker mid-step fails the run with an error naming the role and
rank, and a resumed run continues from the last complete checkpoint."""

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


def _config(tmp: Path, model: Path, steps: int):
    from rlweave.config.loader import load_config

    cfg = {
        "run": {"name": "ppo-kill", "output_dir": str(tmp / "runs"), "seed": 3, "total_steps": steps,
                "save_every": 2, "keep_last": 2},
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


def test_killed_critic_names_role_and_rank_and_resume_continues(tmp_path, monkeypatch):
    from rlweave.runner.loop import run
    from rlweave_algo_ppo.algorithm import PPO

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    model = _build_model(tmp_path / "model")
    train = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(6) for b in range(6)]
    test = [{"prompt": f"{a}-{b}=", "answer": a - b} for a in range(3, 6) for b in range(3)]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _config(tmp_path, model, steps=4)
    run_dir = tmp_path / "runs" / "ppo-kill"

    killed: list[int] = []
    original = PPO._experience

    def kill_critic_then_continue(self, batch, metrics):
        if self.steps_done == 2 and not killed:  # step 3, after the step-2 checkpoint
            (info,) = self.ctx.roles["critic"].ping().result()
            os.kill(info["pid"], signal.SIGKILL)
            killed.append(info["pid"])
        return original(self, batch, metrics)

    monkeypatch.setattr(PPO, "_experience", kill_critic_then_continue)
    with pytest.raises(Exception) as err:
        run(cfg, run_dir=run_dir)
    assert killed, "the critic was never killed"
    text = str(err.value)
    assert "'critic' rank 0" in text, text
    steps_logged = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(steps_logged) == 2  # step 3 never completed

    monkeypatch.setattr(PPO, "_experience", original)
    summary = run(cfg, run_dir=run_dir, resume=True)
    assert summary["resumed_from"] == 2 and summary["steps"] == 4
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["step"] in (3, 4) and "value_loss" in r]
    assert [r["step"] for r in resumed] == [3, 4]
    assert summary["eval_after"] is not None and "eval/accuracy" in summary["eval_after"]
    assert (run_dir / "checkpoints" / "step_000004").is_dir()
