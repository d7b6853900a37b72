"""GGUF files of tiny models for tests (no downloads, no llama.cpp).

:func:`write_llama_gguf` writes a Llama Hugging Face directory (``config.json``,
``model.safetensors`` and, when there, a byte-level BPE ``tokenizer.json``) as a GGUF file laid
out as llama.cpp's converter lays it out: its tensor names (``token_embd``, ``blk.N.attn_q`` ...,
``output``), the query and key rows permuted for its rotary layout, the hyperparameters under
``llama.*`` and the tokenizer as ``tokenizer.ggml.*`` metadata (``gpt2`` model: tokens, merges,
token types, special ids) with the chat template. Tensors are written in float32 or float16, so
what transformers reads back equals the source exactly (float32) or after float16 rounding.

:func:`byte_bpe_tokenizer` trains a small byte-level BPE tokenizer locally, the kind a GGUF
carries, for a tiny model to be built with (:mod:`rlweave.testing.tiny_model`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

#: ChatML, as Qwen's and SmolLM2's chat templates render turns
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: special tokens of :func:`byte_bpe_tokenizer`, ids 0-2 in this order (BOS/EOS/pad, ChatML's turn marks)
BPE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 320, chat_template: str = CHATML_TEMPLATE):
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer, no prefix space) trained on ``texts``
    with :data:`BPE_SPECIALS`, as a ``PreTrainedTokenizerFast``: ``<|endoftext|>`` is BOS and pad,
    ``<|im_end|>`` EOS, left padding, ``chat_template`` set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(BPE_SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BPE_SPECIALS[0], eos_token=BPE_SPECIALS[2],
                                   pad_token=BPE_SPECIALS[0], padding_side="left", clean_up_tokenization_spaces=False)
    fast.chat_template = chat_template
    return fast


def _permute(w, n_head: int):
    """llama.cpp's row order of a query/key projection (its rotary pairs interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer_metadata(writer, model_dir: Path) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    conf = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    if tok["model"]["type"] != "BPE":
        raise ValueError(f"{model_dir}/tokenizer.json: a byte-level BPE tokenizer is needed, not "
                         f"{tok['model']['type']}")
    vocab = dict(tok["model"]["vocab"])
    special = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    vocab.update(special)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError(f"{model_dir}/tokenizer.json: token ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: CONTROL, 1: NORMAL
    writer.add_token_merges(merges)
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("pad_token", writer.add_pad_token_id)):
        name = conf.get(key)
        name = name.get("content") if isinstance(name, dict) else name
        if name in ids:
            add(ids[name])
    template = conf.get("chat_template")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if template:
        writer.add_chat_template(template)


def write_llama_gguf(model_dir: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write the Llama model of ``model_dir`` as the GGUF file ``out`` (see the module docstring);
    ``dtype``: ``float32`` or ``float16`` for the matrices (norms stay float32). Returns ``out``."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{model_dir}: a Llama model is needed, not {cfg.get('model_type')}")
    weights = load_file(str(model_dir / "model.safetensors"))
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(float(rope))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "float16" else gguf.LlamaFileType.ALL_F32)
    if (model_dir / "tokenizer.json").is_file():
        _tokenizer_metadata(w, model_dir)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in parts.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf_name, array in weights.items():
        if hf_name not in names:
            raise ValueError(f"{model_dir}: tensor {hf_name} has no GGUF name here")
        a = array.astype(np.float32)
        if hf_name.endswith("q_proj.weight"):
            a = _permute(a, n_head)
        elif hf_name.endswith("k_proj.weight"):
            a = _permute(a, n_kv)
        if dtype == "float16" and a.ndim > 1:
            a = a.astype(np.float16)
        w.add_tensor(names[hf_name], np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
