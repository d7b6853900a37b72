"""A tiny random Qwen2-VL checkpoint for tests and the vision example (no downloads).

:func:`build_tiny_qwen2_vl` writes a Hugging Face directory that transformers loads with
``AutoModelForImageTextToText`` and rlweave's vision processor (:mod:`rlweave.data.vision`)
loads beside it: ``config.json`` + ``model.safetensors``, a character-level tokenizer with the
Qwen2-VL vision tokens (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``,
``<|video_pad|>``) and a chat template that renders image parts of a message as
``<|vision_start|><|image_pad|><|vision_end|>``, and ``preprocessor_config.json`` (Qwen2-VL's
image processor with small patches and the pixel bounds given). Same arguments and seed ->
identical files.
"""

from __future__ import annotations

from pathlib import Path

#: the Qwen2-VL vision tokens, in the order they are added to the tokenizer
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")

#: turns concatenated; string contents as they are, list contents part by part (an image part as
#: the vision tokens, a text part as its text); assistant turns end with EOS
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['content'] is string %}{% set body = m['content'] %}{% else %}{% set body = namespace(t='') %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "{% set body.t = body.t + '<|vision_start|><|image_pad|><|vision_end|>' %}"
    "{% else %}{% set body.t = body.t + p['text'] %}{% endif %}{% endfor %}{% set body = body.t %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ body + eos_token }}{% else %}{{ body }}{% endif %}"
    "{% endfor %}"
)


def vision_tokenizer(texts, *, max_length: int = 512):
    """:func:`rlweave.testing.tiny_tokenizer.char_tokenizer` on ``texts`` plus
    :data:`VISION_TOKENS` (special: never split, skipped when decoding) and
    :data:`CHAT_TEMPLATE`."""
    from rlweave.testing.tiny_tokenizer import char_tokenizer

    tok = char_tokenizer(texts, max_length=max_length, chat_template=CHAT_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tok


def build_tiny_qwen2_vl(
    path: str | Path,
    tokenizer,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    seed: int = 0,
    *,
    vision_depth: int = 2,
    vision_dim: int = 32,
    vision_heads: int = 4,
    patch_size: int = 4,
    merge_size: int = 2,
    min_pixels: int = 16 * 16,
    max_pixels: int = 32 * 32,
    max_positions: int = 1024,
    init_std: float | None = 0.08,
) -> Path:
    """Build a random ``Qwen2VLForConditionalGeneration`` with ``tokenizer``
    (:func:`vision_tokenizer`) and save it, its tokenizer and its image processor under
    ``path``; returns the path. ``hidden // heads`` must be divisible by 4 (M-RoPE sections);
    ``min_pixels``/``max_pixels`` bound each image's resized area (the image processor's
    ``size``), so an image costs ``h * w / (patch_size * merge_size) ** 2`` tokens."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlweave.testing.tiny_model import _redraw, _special_ids

    head_dim = hidden // heads
    if hidden % heads or head_dim % 4 or heads % kv_heads:
        raise ValueError(f"build_tiny_qwen2_vl: hidden {hidden}, heads {heads}, kv_heads {kv_heads}: "
                         "hidden/heads must be a multiple of 4 and heads a multiple of kv_heads")
    missing = [t for t in VISION_TOKENS if tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id)]
    if missing:
        raise ValueError(f"build_tiny_qwen2_vl: the tokenizer lacks {missing} (build it with vision_tokenizer)")
    ids = _special_ids(tokenizer)
    vid = tokenizer.convert_tokens_to_ids
    half = head_dim // 2  # rotary frequencies per head, split over (time, height, width)
    section = [half - 2 * (half // 3), half // 3, half // 3]
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=ffn,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "mrope_section": section}, **ids),
        vision_config=dict(depth=vision_depth, embed_dim=vision_dim, hidden_size=hidden, num_heads=vision_heads,
                           mlp_ratio=2, patch_size=patch_size, spatial_merge_size=merge_size,
                           temporal_patch_size=2, in_channels=3),
        image_token_id=vid("<|image_pad|>"), video_token_id=vid("<|video_pad|>"),
        vision_start_token_id=vid("<|vision_start|>"), vision_end_token_id=vid("<|vision_end|>"),
        tie_word_embeddings=False, **ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Qwen2VLForConditionalGeneration(cfg)
        if init_std is not None:
            _redraw(model, init_std)
    model.generation_config = transformers.GenerationConfig(**ids, do_sample=False)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                             min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out)
    return out
