"""GRPO with a LoRA policy through ``rlweave train`` (in process, the rollout engine receiving only
the adapter: ``weight_sync.lora: adapter``), its checkpoint exported as a PEFT adapter and as a merged
model.

With ``kl.beta > 0`` and no ``roles.reference``, the reference is the policy with its adapters
disabled: no reference rank is started (``workers.json``), the KL is exactly 0 while the adapters'
B matrices are still zero (step 1) and positive once they trained; the engine generates with the adapter
(its log-probs equal the policy's); the checkpoint holds the adapters only, and the two exports give
the same logits. (vLLM with merged weights and with an adapter: ``plugins/backend_fsdp/tests/test_fsdp_lora.py``.)
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from rlweave.testing.runs import cli_env, length_reward, metrics_rows, run_cli, workers

pytestmark = pytest.mark.slow  # a run and an engine: scheduled first

LORA = {"r": 8, "alpha": 32, "target_modules": "all-linear"}


@pytest.fixture(scope="module")
def lora_run(grpo_workspace, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-run")
    config = grpo_workspace.config("lora", 2, run={"scheduler": "in_process", "save_every": 2},
                                   logging={"backends": ["jsonl"]},
                                   rewards=[{"name": length_reward(tmp)}],  # every step changes the adapters
                                   roles={"policy": {"lora": LORA, "optim": {"lr": 5e-2}}},
                                   weight_sync={"lora": "adapter"}, algorithm={"kl": {"beta": 0.1}})
    rc, out, _ = run_cli(["train", str(config)], cli_env(tmp))
    assert rc == 0, out[-4000:]
    return grpo_workspace.root / "runs" / "lora", tmp


def test_no_reference_rank_and_kl_from_the_base_model(lora_run):
    run_dir, _ = lora_run
    assert set(workers(run_dir)) == {"policy", "rollout"}
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["kl"] == 0.0, "B starts at zero: the policy is its base model at step 1"
    assert math.isfinite(steps[1]["kl"]) and steps[1]["kl"] > 0
    assert steps[1]["logprob_gap"] < 1e-3, "the engine generates with the adapter"
    adapters = list((run_dir / "weight_sync" / "policy-rollout").iterdir())
    assert [p.name for p in adapters] == ["adapter-000003"], "one sync at setup, one per step; the newest kept"
    size = sum(f.stat().st_size for f in adapters[0].iterdir())
    assert all(r["sync_bytes"] == size for r in steps), "a sync ships the adapter, not the model"


def test_checkpoint_holds_adapters_only(lora_run):
    import torch.distributed.checkpoint as dcp

    run_dir, _ = lora_run
    ckpt = max((run_dir / "checkpoints").glob("step_*"))
    assert sorted(p.name for p in (ckpt / "roles").iterdir()) == ["policy"]
    reader = dcp.FileSystemReader(str(ckpt / "roles" / "policy"))
    keys = list(reader.read_metadata().state_dict_metadata)
    weights = [k for k in keys if k.startswith("model.")]
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights), weights
    with_state = {k.rsplit(".", 1)[0] for k in keys if k.startswith("optim.state.")}  # one per trained tensor
    assert len(with_state) == len(weights)


def test_export_adapter_and_merged(lora_run, grpo_workspace):
    from peft import PeftModel
    from rlweave.commands.export import export_checkpoint
    from transformers import AutoModelForCausalLM

    run_dir, tmp = lora_run
    export_checkpoint(run_dir, tmp / "adapter", say=lambda _: None)
    export_checkpoint(run_dir, tmp / "merged", say=lambda _: None, merge=True)  # rlweave export --merge
    assert json.loads((tmp / "merged" / "rlweave_export.json").read_text())["format"] == "hf_model"
    assert json.loads((tmp / "adapter" / "rlweave_export.json").read_text())["format"] == "peft_adapter"
    base = AutoModelForCausalLM.from_pretrained(grpo_workspace.model, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(tmp / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp / "merged"), dtype=torch.float32).eval()
    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "hf"), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    with torch.no_grad():
        a, b, c = peft_model(ids).logits, merged(ids).logits, final(ids).logits
    assert float((a - b).abs().max()) < 1e-5
    assert torch.equal(b, c), "the run's hf/ is the merged model of its last checkpoint"
