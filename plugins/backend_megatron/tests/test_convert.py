"""HF <-> megatron-core names and layouts (:mod:`rlweave_backend_megatron.convert`): the per-group
fused QKV (GQA and MHA), gate/up fused ``linear_fc1``, tensor-parallel split/merge, the
whole-model round trip over a saved tiny Qwen2 (tied and untied, padded vocabulary), the
config refusals and the Transformer Engine name aliases."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from rlweave.backend_helpers.hf_dir import HFReader
from rlweave.testing.tiny_model import build_tiny_qwen2
from rlweave_backend_megatron import convert

#: GQA: 8 query heads over 2 key/value groups (4 per group), head_dim 4, hidden 32
GQA = convert.Shape(arch="qwen2", hidden=32, heads=8, kv_heads=2, head_dim=4, ffn=48, layers=2, vocab=100,
                    padded_vocab=128, tied=False, qkv_bias=True, rope_theta=1e4, norm_eps=1e-6, max_positions=64)
MHA = replace(GQA, kv_heads=8)

#: a minimal config.json of a dense Qwen2 / Llama
BASE = {"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 100}


def _qkv(shape: convert.Shape, bias: bool = False):
    """Distinct-valued HF q/k/v projections (weights, or biases when ``bias``)."""
    rest = () if bias else (shape.hidden,)
    rows_q, rows_kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    n_q, n_kv = rows_q * (1 if bias else shape.hidden), rows_kv * (1 if bias else shape.hidden)
    q = torch.arange(n_q, dtype=torch.float32).reshape(rows_q, *rest)
    k = (10_000 + torch.arange(n_kv, dtype=torch.float32)).reshape(rows_kv, *rest)
    v = (20_000 + torch.arange(n_kv, dtype=torch.float32)).reshape(rows_kv, *rest)
    return q, k, v


# ---------------------------------------------------------------- fused QKV
@pytest.mark.parametrize("shape", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_fuse_unfuse_round_trip(shape, bias):
    q, k, v = _qkv(shape, bias)
    fused = convert.fuse_qkv(q, k, v, shape)
    assert fused.shape == ((shape.heads + 2 * shape.kv_heads) * shape.head_dim, *q.shape[1:])
    q2, k2, v2 = convert.unfuse_qkv(fused, shape)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert torch.equal(a, b) and b.is_contiguous()


@pytest.mark.parametrize("shape", [GQA, MHA], ids=["gqa", "mha"])
def test_fused_layout_is_per_group_queries_then_key_then_value(shape):
    """Megatron's layout: group g holds its query heads (g*per .. g*per+per-1), then key head g,
    then value head g, as HF's repeat_kv pairs query head h with key/value head h // per."""
    q, k, v = _qkv(shape)
    g, d, per = shape.kv_heads, shape.head_dim, shape.q_per_group
    grouped = convert.fuse_qkv(q, k, v, shape).reshape(g, (per + 2) * d, shape.hidden)
    for i in range(g):
        assert torch.equal(grouped[i, : per * d], q[i * per * d:(i + 1) * per * d])
        for j in range(per):  # query head i*per+j, in order
            assert torch.equal(grouped[i, j * d:(j + 1) * d], q[(i * per + j) * d:(i * per + j + 1) * d])
        assert torch.equal(grouped[i, per * d:(per + 1) * d], k[i * d:(i + 1) * d])
        assert torch.equal(grouped[i, (per + 1) * d:], v[i * d:(i + 1) * d])


# ---------------------------------------------------------------- tensor-parallel split / merge
KINDS = {
    "decoder.layers.0.self_attention.linear_qkv.weight": "rows",
    "decoder.layers.3.self_attention.linear_qkv.bias": "rows",
    "embedding.word_embeddings.weight": "rows",
    "output_layer.weight": "rows",
    "decoder.layers.1.self_attention.linear_proj.weight": "cols",
    "decoder.layers.1.mlp.linear_fc2.weight": "cols",
    "decoder.layers.0.mlp.linear_fc1.weight": "gate_up",
    "decoder.layers.0.input_layernorm.weight": "none",
    "decoder.layers.0.pre_mlp_layernorm.weight": "none",
    "decoder.final_layernorm.weight": "none",
    "output_layer.score.weight": "none",
    # Transformer Engine's fused-norm names are norms too
    "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight": "none",
    "decoder.layers.2.mlp.linear_fc1.layer_norm_weight": "none",
}


@pytest.mark.parametrize("name,kind", list(KINDS.items()))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_merge_round_trip(name, kind, tp):
    assert convert.split_kind(name) == kind
    full = torch.randn(16) if kind == "none" or name.endswith("bias") else torch.randn(16, 24)
    shards = [convert.split(name, full, tp, r) for r in range(tp)]
    if kind == "none" or tp == 1:
        assert all(s is full for s in shards)
    elif kind == "cols":
        assert all(s.shape == (16, 24 // tp) for s in shards)
    else:
        assert all(s.shape[0] == 16 // tp for s in shards)
    assert torch.equal(convert.merge(name, shards), full)


@pytest.mark.parametrize("tp", [2, 4])
def test_split_fc1_gives_each_rank_its_gate_rows_over_its_up_rows(tp):
    ffn, hidden = 8, 3
    gate = torch.arange(ffn * hidden, dtype=torch.float32).reshape(ffn, hidden)
    up = 1000 + gate
    full = torch.cat([gate, up])
    n = ffn // tp
    for r in range(tp):
        shard = convert.split("decoder.layers.0.mlp.linear_fc1.weight", full, tp, r)
        assert torch.equal(shard, torch.cat([gate[r * n:(r + 1) * n], up[r * n:(r + 1) * n]]))


@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_split_qkv_gives_each_rank_whole_groups(bias):
    q, k, v = _qkv(GQA, bias)
    name = "decoder.layers.0.self_attention.linear_qkv." + ("bias" if bias else "weight")
    fused = convert.fuse_qkv(q, k, v, GQA)
    d, per = GQA.head_dim, GQA.q_per_group
    for r in range(2):  # 2 groups over tp=2: group r on rank r
        shard = convert.split(name, fused, 2, r)
        one = replace(GQA, heads=per, kv_heads=1)
        sq, sk, sv = convert.unfuse_qkv(shard, one)
        assert torch.equal(sq, q[r * per * d:(r + 1) * per * d])
        assert torch.equal(sk, k[r * d:(r + 1) * d]) and torch.equal(sv, v[r * d:(r + 1) * d])


# ---------------------------------------------------------------- whole model over a saved HF directory
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_full_from_hf_round_trip_over_a_saved_model(tmp_path, tied):
    path = build_tiny_qwen2(tmp_path / "m", vocab_size=100, hidden=32, heads=4, kv_heads=2, ffn=48,
                            tie_word_embeddings=tied)
    shape = convert.shape_from_config(json.loads((path / "config.json").read_text()), tp=2, vocab_multiple=16,
                                      source=str(path / "config.json"))
    assert (shape.vocab, shape.padded_vocab, shape.tied, shape.qkv_bias) == (100, 128, tied, True)
    with HFReader(path) as read:
        keys = set(read.where)
        back: dict[str, torch.Tensor] = {}
        names = convert.full_names(shape)
        assert ("output_layer.weight" in names) is (not tied)
        for name in names:
            full = convert.full_from_hf(name, read, shape)
            if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
                assert full.shape == (shape.padded_vocab, shape.hidden)
                assert torch.count_nonzero(full[shape.vocab:]) == 0
            if name.endswith("linear_qkv.weight"):
                assert full.shape == ((shape.heads + 2 * shape.kv_heads) * shape.head_dim, shape.hidden)
            if name.endswith("linear_fc1.weight"):
                i = name.split(".")[2]
                assert torch.equal(full, torch.cat([read(f"model.layers.{i}.mlp.gate_proj.weight"),
                                                    read(f"model.layers.{i}.mlp.up_proj.weight")]))
            # through the tensor-parallel shards as well
            full = convert.merge(name, [convert.split(name, full, 2, r) for r in range(2)])
            for hf_name, t in convert.hf_from_full(name, full, shape):
                assert hf_name not in back, f"{hf_name} produced twice"
                back[hf_name] = t
        expected = keys - ({"lm_head.weight"} if tied else set())
        assert set(back) == expected
        for n in expected:
            assert torch.equal(back[n], read(n)), n
        # a tied output layer reads the embedding and exports nothing
        out = convert.full_from_hf("output_layer.weight", read, shape)
        assert torch.equal(out[: shape.vocab], read("model.embed_tokens.weight" if tied else "lm_head.weight"))
        if tied:
            assert convert.hf_from_full("output_layer.weight", out, shape) == []
    # iter_hf streams the same tensors
    with HFReader(path) as read:
        streamed = dict(convert.iter_hf(names, lambda n: convert.full_from_hf(n, read, shape), shape))
        assert set(streamed) == expected
        assert all(torch.equal(streamed[n], read(n)) for n in expected)


def test_te_names_and_value_head_convert():
    hf = {"model.layers.1.input_layernorm.weight": torch.randn(32),
          "model.layers.1.post_attention_layernorm.weight": torch.randn(32),
          "score.weight": torch.randn(1, 32)}
    read = hf.__getitem__
    assert torch.equal(convert.full_from_hf("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", read, GQA),
                       hf["model.layers.1.input_layernorm.weight"])
    assert convert.hf_from_full("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", hf["score.weight"], GQA)[0][0] \
        == "model.layers.1.post_attention_layernorm.weight"
    names = convert.full_names(GQA, kind="value")
    assert names[-1] == convert.HEAD + ".weight" and "output_layer.weight" not in names
    assert torch.equal(convert.full_from_hf(convert.HEAD + ".weight", read, GQA), hf["score.weight"])
    assert convert.hf_from_full(convert.HEAD + ".weight", hf["score.weight"], GQA)[0][0] == "score.weight"
    for bad in ("decoder.layers.0.self_attention.core_attention.weight", "something.else"):
        with pytest.raises(KeyError, match="no HF source for parameter"):
            convert.full_from_hf(bad, read, GQA)
        with pytest.raises(KeyError, match="no HF name for parameter"):
            convert.hf_from_full(bad, torch.zeros(1), GQA)


def test_full_names_count_and_order():
    names = convert.full_names(GQA)
    assert names[0] == "embedding.word_embeddings.weight" and names[-1] == "output_layer.weight"
    assert names[-2] == "decoder.final_layernorm.weight"
    assert len(names) == 1 + 7 * GQA.layers + 2
    llama = replace(GQA, arch="llama", qkv_bias=False, tied=True)
    ln = convert.full_names(llama)
    assert len(ln) == 1 + 6 * llama.layers + 1 and not any(n.endswith("linear_qkv.bias") for n in ln)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("patch,words", [
    ({"model_type": "gemma"}, ["model_type", "'gemma'"]),
    ({"num_experts": 8}, ["mixture-of-experts"]),
    ({"num_local_experts": 8}, ["mixture-of-experts"]),
    ({"hidden_act": "gelu"}, ["hidden_act", "'gelu'"]),
    ({"model_type": "llama", "attention_bias": True}, ["attention_bias"]),
    ({"model_type": "llama", "mlp_bias": True}, ["mlp_bias"]),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}, ["rope", "'llama3'"]),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, ["rope", "'yarn'"]),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["rope", "'linear'"]),
    ({"use_sliding_window": True, "sliding_window": 16}, ["use_sliding_window"]),
], ids=["arch", "moe-qwen", "moe-mixtral", "act", "llama-attn-bias", "llama-mlp-bias", "llama3", "yarn", "legacy-linear",
        "sliding"])
def test_shape_from_config_refuses_with_source_and_key(patch, words):
    with pytest.raises(ValueError) as e:
        convert.shape_from_config({**BASE, **patch}, source="/models/x/config.json")
    msg = str(e.value)
    assert "/models/x/config.json" in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("key", ["num_experts", "num_local_experts"])
def test_moe_refusal_names_the_key(key):
    with pytest.raises(ValueError, match=key):
        convert.shape_from_config({**BASE, key: 4}, source="config.json")


@pytest.mark.parametrize("vocab,mult,tp,padded", [
    (100, 128, 1, 128), (128, 128, 1, 128), (129, 128, 1, 256), (100, 128, 2, 256), (256, 128, 2, 256),
    (151936, 128, 2, 152064), (151936, 128, 4, 152064), (32000, 128, 8, 32768), (100, 16, 2, 128),
    (100, 1, 1, 100), (100, 0, 3, 102),
])
def test_padded_vocab(vocab, mult, tp, padded):
    s = convert.shape_from_config({**BASE, "vocab_size": vocab}, tp=tp, vocab_multiple=mult)
    assert s.vocab == vocab and s.padded_vocab == padded
    assert s.padded_vocab % (max(1, mult) * tp) == 0 and s.padded_vocab - vocab < max(1, mult) * tp


def test_shape_fields_text_config_head_dim_and_rope_theta():
    s = convert.shape_from_config({"model_type": "llama", "text_config": {**BASE, "model_type": "llama"}})
    assert (s.arch, s.hidden, s.heads, s.kv_heads, s.head_dim, s.qkv_bias) == ("llama", 32, 4, 2, 8, False)
    with pytest.raises(ValueError, match="architecture 'llava'"):  # the directory's own model_type decides
        convert.shape_from_config({"model_type": "llava", "text_config": {**BASE, "model_type": "llama"}})
    assert convert.shape_from_config({**BASE, "head_dim": 16}).head_dim == 16
    assert convert.shape_from_config({**BASE, "num_key_value_heads": None}).kv_heads == 4
    assert convert.shape_from_config(
        {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}).rope_theta == 1e6
    assert convert.shape_from_config({**BASE, "rope_theta": 5e5}).rope_theta == 5e5
    assert convert.shape_from_config({**BASE, "rope_theta": 5e5, "rope_scaling": None}).rope_theta == 5e5
    assert convert.shape_from_config(BASE).rope_theta == 1e4
    s = convert.shape_from_config({**BASE, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                                   "max_position_embeddings": 321})
    assert (s.tied, s.norm_eps, s.max_positions, s.qkv_bias, s.q_per_group) == (True, 1e-5, 321, True, 2)


# ---------------------------------------------------------------- names
def test_canonical_and_local_to_global():
    assert convert.canonical("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") == \
        "decoder.layers.3.input_layernorm.weight"
    assert convert.canonical("decoder.layers.12.mlp.linear_fc1.layer_norm_weight") == \
        "decoder.layers.12.pre_mlp_layernorm.weight"
    for same in ("decoder.layers.3.self_attention.linear_qkv.weight", "decoder.layers.3.input_layernorm.weight",
                 "decoder.final_layernorm.weight", "embedding.word_embeddings.weight", "output_layer.weight",
                 "mlp.linear_fc1.layer_norm_weight"):
        assert convert.canonical(same) == same
    assert convert.local_to_global("decoder.layers.0.mlp.linear_fc1.weight", 5) == \
        "decoder.layers.5.mlp.linear_fc1.weight"
    assert convert.local_to_global("decoder.layers.11.input_layernorm.weight", 12) == \
        "decoder.layers.23.input_layernorm.weight"
    assert convert.local_to_global("decoder.layers.2.x", 0) == "decoder.layers.2.x"
    for same in ("decoder.final_layernorm.weight", "output_layer.weight", "embedding.word_embeddings.weight"):
        assert convert.local_to_global(same, 7) == same


def test_qwen3_moe_experts_round_trip_and_split_over_expert_ranks(tmp_path):
    """A saved Qwen3-MoE: its shape, the stacked experts built from the per-expert HF matrices and
    back, and each expert-parallel rank's experts (contiguous halves)."""
    from rlweave.testing.tiny_model import build_tiny_qwen3_moe

    d = build_tiny_qwen3_moe(tmp_path / "q3", seed=1)
    shape = convert.shape_from_config(json.loads((d / "config.json").read_text()))
    assert (shape.num_experts, shape.top_k, shape.moe_ffn, shape.norm_topk, shape.qk_norm) == (8, 2, 32, True, True)
    names = convert.full_names(shape)
    assert "decoder.layers.1.mlp.experts.gate_up" in names and not any("linear_fc1" in n for n in names)
    with HFReader(str(d)) as read:
        fulls = {n: convert.full_from_hf(n, read, shape) for n in names}
        hf = dict(convert.iter_hf(names, fulls.__getitem__, shape))
        for name, t in hf.items():
            assert torch.equal(t, read(name)), name
    assert len(hf) == 3 + 2 * (2 + 4 + 1 + 2 + 3 * 8)  # embed, norm, head + per layer: norms, qkvo, q/k norm, router, experts
    gate_up = fulls["decoder.layers.0.mlp.experts.gate_up"]
    assert gate_up.shape == (8, 64, 64)
    halves = [convert.split_ep("decoder.layers.0.mlp.experts.gate_up", gate_up, 2, r) for r in range(2)]
    assert torch.equal(torch.cat(halves), gate_up) and halves[1].shape[0] == 4
    router = fulls["decoder.layers.0.mlp.router.weight"]
    assert convert.split_ep("decoder.layers.0.mlp.router.weight", router, 2, 1) is router  # replicated
