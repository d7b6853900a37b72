"""The transformers engine on tiny MoE models (Qwen3-MoE, Qwen2-MoE with a shared expert,
Mixtral), fp32: greedy output equals transformers ``generate`` on the same directory; weights
streamed in checkpoint names, one matrix per expert (``mlp.experts.<e>.up_proj.weight``,
Mixtral's ``block_sparse_moe.experts.<e>.w3.weight``), land in the model's stacked expert
parameters, so greedy output then equals transformers loading those weights from disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61]]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)


def _build(kind: str, path: Path) -> Path:
    from rlweave.testing import tiny_model

    if kind == "qwen3_moe":
        return tiny_model.build_tiny_qwen3_moe(path, seed=3)
    if kind == "qwen2_moe":
        return tiny_model.build_tiny_qwen2_moe(path, seed=3)
    return tiny_model.build_tiny_mixtral(path)


def _perturbed_copy(model_dir: Path, out: Path) -> dict:
    """``model_dir`` copied to ``out`` with every MoE tensor (experts, routers, shared expert)
    changed, in checkpoint names; returns the new weights."""
    from rlweave.testing.tiny_model import perturbed_copy

    return perturbed_copy(model_dir, out, (".experts.", ".mlp.gate.", ".block_sparse_moe.gate.", ".shared_expert"))


def _reference(model_dir: Path) -> list[list[int]]:
    from rlweave.testing.reference import load_reference_model, reference_greedy

    model = load_reference_model(model_dir)
    return [reference_greedy(model, p, NEW_TOKENS) for p in PROMPTS]


def _engine(model_dir: Path):
    from rlweave_infer_hf.engine import HFEngine

    engine = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 64},
                                    model={"path": str(model_dir), "dtype": "float32"}, seed=1))
    engine.init_engine()
    return engine


def _greedy(engine) -> list[list[int]]:
    return [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_expert_weights_in_checkpoint_names_update_in_place(kind, tmp_path):
    model_dir = _build(kind, tmp_path / "base")
    new = _perturbed_copy(model_dir, tmp_path / "perturbed")
    assert any(".experts.0." in n for n in new) and not any(n.endswith("gate_up_proj") for n in new)
    engine = _engine(model_dir)
    try:
        before = _greedy(engine)
        assert before == _reference(model_dir)
        stacked = {n: p.data_ptr() for n, p in engine.model.named_parameters() if p.dim() == 3}
        assert stacked, "transformers holds the experts stacked"
        stats = engine.load_weights(iter(new.items()))
        assert stats["tensors"] == len(new)
        after = _greedy(engine)
        assert {n: p.data_ptr() for n, p in engine.model.named_parameters() if p.dim() == 3} == stacked  # in place
    finally:
        engine.shutdown()
    want = _reference(tmp_path / "perturbed")
    assert after == want
    assert want != before, "the perturbation must change the greedy output for the check to mean anything"


def test_stacked_names_and_bad_expert_index(tmp_path):
    """The model's own (stacked) names still load; an expert index past the layer's experts
    is refused naming the tensor."""
    import torch

    model_dir = _build("qwen3_moe", tmp_path / "base")
    engine = _engine(model_dir)
    try:
        before = _greedy(engine)
        own = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        assert engine.load_weights(iter(own.items()))["tensors"] == len(own)
        assert _greedy(engine) == before
        bad = "model.layers.0.mlp.experts.8.up_proj.weight"
        with pytest.raises(ValueError, match=r"rollout.*experts\.8\.up_proj.*expert 8 does not exist.*8 experts"):
            engine.load_weights([(bad, torch.zeros(32, 64))])
        with pytest.raises(ValueError, match="unknown tensor 'model.layers.0.mlp.nope.weight'"):
            engine.load_weights([("model.layers.0.mlp.nope.weight", torch.zeros(2))])
        with pytest.raises(ValueError, match=r"experts\.1\.down_proj.*shape \(32, 64\), model expects \(64, 32\)"):
            engine.load_weights([("model.layers.0.mlp.experts.1.down_proj.weight", torch.zeros(32, 64))])
    finally:
        engine.shutdown()
