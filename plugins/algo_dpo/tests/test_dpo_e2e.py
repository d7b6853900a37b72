"""``rlweave train`` with the shipped examples/arith/dpo.yaml and online_dpo.yaml, a few
steps each on a tiny model built by examples/arith/build_model.py (FSDP, HF engine,
arith_exact reward: the real components; every role in the controller's process,
``run.scheduler=in_process``, as the examples' roles have one rank each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ARITH = ROOT / "examples" / "arith"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpo_e2e")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from pathlib import Path; import make_data, build_model;"
        "make_data.make(Path(sys.argv[2]) / 'data', seed=0, n_test=40, n_sft=50, n_pref=64, n_pref_test=8, n_rank=8);"
        "build_model.build(Path(sys.argv[2]) / 'model', data_dir=Path(sys.argv[2]) / 'data', hidden=32, layers=1,"
        " heads=2, kv_heads=1, ffn=64)"
    )
    subprocess.run([sys.executable, "-c", code, str(ARITH), str(d)], check=True, timeout=300)
    return d


def train(example: str, task: Path, *overrides: str) -> dict:
    run_dir = task / f"run_{example}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "rlweave.cli", "train", str(ARITH / example), "--run-dir", str(run_dir),
           f"model.path={task / 'model'}", "run.total_steps=2", "data.batch_size=4", "data.eval_size=8",
           f"data.eval={task / 'data' / 'test.jsonl'}", "run.scheduler=in_process", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "rows": rows, "out": proc.stdout + proc.stderr, "run_dir": run_dir}


def test_dpo_example_trains(tiny_task):
    r = train("dpo.yaml", tiny_task, f"data.train={tiny_task / 'data' / 'pref_train.jsonl'}")
    steps = [row for row in r["rows"] if "dpo_loss" in row]
    assert len(steps) == 2
    assert abs(steps[0]["dpo_loss"] - 0.6931) < 1e-3  # policy == reference at the first step
    assert all(abs(s["loss"]) < 1e6 for s in steps)
    assert r["summary"]["eval_before"] is not None and "eval/accuracy" in r["summary"]["eval_after"]
    assert (r["run_dir"] / "dpo_reference_logps.json").exists()
    assert (Path(r["summary"]["hf_path"]) / "config.json").exists()


def test_online_dpo_example_trains(tiny_task):
    # a random tiny model never answers right, so arith_exact would tie every prompt; a
    # format reward (the answer starts with a digit) gives mixed rewards and real updates
    r = train("online_dpo.yaml", tiny_task, f"data.train={tiny_task / 'data' / 'rl_train.jsonl'}",
              "algorithm.n_samples=3", "rewards=[{name: format, args: {pattern: '[0-9].*', where: response, flags: s}}]")
    steps = [row for row in r["rows"] if "tied_prompts" in row]
    assert len(steps) == 2
    for s in steps:  # every prompt is a pair, a tie, or has too few usable samples
        assert s["pairs"] + s["tied_prompts"] + s["too_few_samples"] == 4
        assert s["skipped_update"] == 1.0 or "time/sync" in s  # synced after every update
    assert any(s["skipped_update"] == 0.0 and s["pairs"] > 0 for s in steps)
    assert r["summary"]["eval_after"] is not None
