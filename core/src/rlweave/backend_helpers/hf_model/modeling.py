"""Building the three model kinds from a local Hugging Face directory, and finding their
parts.

* ``causal_lm``: ``AutoModelForCausalLM`` (the LM head is the model's own); state-dict names
  are the HF names. A vision-language directory (a ``vision_config`` in ``config.json``,
  :func:`rlweave.data.vision.is_vision_model`) loads with ``AutoModelForImageTextToText``:
  the vision tower, the language model and its head (:mod:`.vision` runs it).
* ``value`` (critic) and ``reward``: the HF backbone (``AutoModel``) under a scalar head
  (:mod:`.heads`).

:func:`decoder_layers` finds the repeated blocks a backend shards, compiles or patches;
:func:`tied_lm_head` says whether the LM head shares the input embedding (left out of exports).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlweave.backend_helpers.hf_model.heads import ScalarHeadModel, init_head


def load_model(model_cfg: dict[str, Any], attn_impl: str, dtype: torch.dtype, seed: int, *, backend: str) -> nn.Module:
    """Build the model described by ``ctx.model`` on CPU in ``dtype`` (same on all ranks), with
    transformers' attention implementation ``attn_impl``; errors name ``backend``:
    FileNotFoundError for a ``model.path`` that is not a local directory, ValueError for an
    unknown ``model_type`` or a saved head that does not fit (:func:`.heads.init_head`)."""
    from transformers import AutoModel, AutoModelForCausalLM

    path = model_cfg.get("path")
    if not path or not Path(path).is_dir():
        raise FileNotFoundError(f"{backend} backend: model.path {path!r} is not a local directory (no hub downloads)")
    kind = model_cfg.get("model_type", "causal_lm")
    common = dict(
        dtype=dtype,
        attn_implementation=attn_impl,
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        local_files_only=True,
    )
    from rlweave.data.vision import is_vision_model

    if kind == "causal_lm" and is_vision_model(path):
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(path, **common)
    elif is_vision_model(path):
        raise ValueError(f"{backend} backend: model.path {path!r} is a vision-language model; model_type {kind!r} "
                         "(a value or reward head) is not supported for it, only causal_lm")
    elif kind == "causal_lm":
        model = AutoModelForCausalLM.from_pretrained(path, **common)
    elif kind in ("value", "reward"):
        backbone = AutoModel.from_pretrained(path, **common)
        hidden = backbone.config.hidden_size
        model = ScalarHeadModel(backbone, hidden).to(dtype)
        init_head(model, path, kind, dtype, seed, backend=backend)
    else:
        raise ValueError(f"{backend} backend: unknown model_type {kind!r} (choose causal_lm, value, reward)")
    model.config.use_cache = False
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks, in order; ValueError for a model without them."""
    base = model.model if hasattr(model, "model") else model
    base = getattr(base, "language_model", base)  # a vision-language model's text decoder
    base = getattr(base, "model", base) if not hasattr(base, "layers") else base
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"HF model layer: cannot find decoder layers in {type(model).__name__}")
    return list(layers)


def tied_lm_head(model: nn.Module) -> bool:
    """Whether ``model`` has an LM head tied to its input embedding."""
    cfg = getattr(model, "config", None)
    return bool(getattr(cfg, "tie_word_embeddings", False)) and hasattr(model, "lm_head")
