"""Tiny random Qwen2 checkpoints for tests and benchmarks (no downloads).

:func:`build_tiny_qwen2` writes a Hugging Face directory (``config.json`` +
``model.safetensors``) that transformers, vLLM and every rlweave backend load like a real
checkpoint. Same arguments and seed -> identical weights. No tokenizer is written.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_qwen2(
    path: str | Path,
    vocab_size: int = 128,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    seed: int = 0,
    *,
    max_positions: int = 2048,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    init_std: float = 0.08,
) -> Path:
    """Build a random ``Qwen2ForCausalLM`` and save it under ``path``; returns the path.

    ``hidden`` must be divisible by ``heads`` and ``heads`` by ``kv_heads``. Matrices are drawn
    with ``init_std`` (wider than HF's 0.02 so tiny models give peaked, testable outputs)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"build_tiny_qwen2: hidden={hidden}, heads={heads}, kv_heads={kv_heads} do not divide")
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, init_std)
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.02)
    model = model.to(getattr(torch, dtype))
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return out
