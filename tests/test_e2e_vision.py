"""A vision-language model through ``rlweave train`` (docs/vision.md): GRPO on the tiny Qwen2-VL of
``examples/vision`` with the example's quadrant records (images from files), FSDP policy and HF
engine in one process, ``run.deterministic``. Resuming from step 1 gives the uninterrupted run's
step-2 weights bit for bit, and an export of the run loads in transformers with its processor and
gives the checkpoint's log-probs."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.runs import cli_env, metrics_rows, run_cli

REPO = Path(__file__).resolve().parents[1]
sc = import_helper(Path(__file__).with_name("vision_scenarios.py"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    """A tiny Qwen2-VL, 16 training and 8 held-out quadrant records, a 2-step GRPO run with a
    checkpoint per step, and a copy of it resumed from step 1."""
    root = tmp_path_factory.mktemp("vision")
    spec = importlib.util.spec_from_file_location("vision_make_data", REPO / "examples/vision/make_data.py")
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    data.write(root / "data", counts={"sft": 1, "rl": 16, "test": 8})
    model = sc.build_model(str(root / "model"))
    cfg = {"run": {"name": "straight", "output_dir": str(root / "runs"), "seed": 5, "total_steps": 2, "save_every": 1,
                   "keep_last": 2, "scheduler": "in_process", "deterministic": True, "eval_every": 2},
           "model": {"path": model, "dtype": "float32"},
           "resources": {"pools": {"default": {"devices_per_node": 2}}},
           "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 1.0e-2}},
                     "rollout": {"engine": "hf", "devices": 1}},
           "algorithm": {"name": "grpo", "n_samples": 4, "max_new_tokens": 3, "eval_max_new_tokens": 2},
           "rewards": [{"name": "arith_exact"}],
           "data": {"train": str(root / "data/quadrant_rl.jsonl"), "eval": str(root / "data/quadrant_test.jsonl"),
                    "batch_size": 4}}
    path = root / "grpo.yaml"
    path.write_text(json.dumps(cfg))
    env = cli_env(root)
    rc, text, _ = run_cli(["train", str(path)], env, timeout=600)
    assert rc == 0, text[-4000:]
    straight = root / "runs" / "straight"
    resumed = root / "runs" / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000002")
    rc, text, _ = run_cli(["train", str(path), "--run-dir", str(resumed), "--resume"], env, timeout=600)
    assert rc == 0, text[-4000:]
    return {"root": root, "straight": straight, "resumed": resumed, "env": env, "model": model}


def test_the_run_trains_on_images_and_resumes_bitwise(workspace):
    from rlweave.backend_helpers.weights_hash import checkpoint_hash

    rows = metrics_rows(workspace["straight"])
    assert any(r.get("grad_norm", 0) > 0 for r in rows)
    assert any("eval/accuracy" in r for r in rows)
    step2 = lambda run: checkpoint_hash(run / "checkpoints" / "step_000002")  # noqa: E731
    assert step2(workspace["resumed"]) == step2(workspace["straight"])
    assert step2(workspace["straight"]) != checkpoint_hash(workspace["straight"] / "checkpoints" / "step_000001")


def test_an_export_loads_with_its_processor_and_gives_the_runs_logprobs(workspace, tmp_path):
    from rlweave.data.vision import VisionProcessor

    out = tmp_path / "export"
    rc, text, _ = run_cli(["export", str(workspace["straight"]), "--out", str(out)], workspace["env"], timeout=300)
    assert rc == 0, text[-3000:]
    assert (out / "preprocessor_config.json").is_file() and (out / "chat_template.jinja").is_file()
    VisionProcessor(out)  # the processor loads from the export alone
    b = sc.batch_of(sc.prompts(str(out)), [[5, 6, 7], [8, 9], [10, 11, 12]])
    exported, base = sc.reference(str(out), b), sc.reference(workspace["model"], b)
    assert not torch.allclose(exported, base)  # trained weights, not the starting ones
    hf = sc.reference(str(workspace["straight"] / "hf"), b)  # what the run itself wrote at its end
    assert torch.allclose(exported, hf, atol=1e-6, rtol=0)


def test_eval_and_generate_take_image_records(workspace, tmp_path):
    run, env = workspace["straight"], workspace["env"]
    rc, text, _ = run_cli(["eval", str(run), "--json"], env, timeout=300)  # the run's data.eval: image records
    assert rc == 0, text[-3000:]
    metrics = json.loads(text[text.index("{"):])
    summary = json.loads((run / "summary.json").read_text())
    assert metrics["records"] == 8 and metrics["exact_match"] == summary["eval_after"]["eval/accuracy"]
    out = tmp_path / "out.jsonl"
    data = workspace["root"] / "data" / "quadrant_test.jsonl"
    rc, text, _ = run_cli(["generate", str(run), "--data", str(data), "--out", str(out), "--max-tokens", "2"], env,
                          timeout=300)
    assert rc == 0, text[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 8 and all("errors" not in r and 0 < r["num_tokens"][0] <= 2 for r in rows)
