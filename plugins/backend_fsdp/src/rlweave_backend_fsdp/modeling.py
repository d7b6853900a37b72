"""Building the three model kinds from a local Hugging Face directory.

* ``causal_lm``: ``AutoModelForCausalLM``; state-dict names are the HF names.
* ``value`` (critic) and ``reward``: :class:`ScalarHeadModel` = the HF backbone
  (``AutoModel``) under ``model.`` plus a bias-free ``score`` Linear(hidden, 1). These are
  the names of ``*ForSequenceClassification`` / ``*ForTokenClassification`` with
  ``num_labels=1``, so saved reward models load in transformers as sequence classifiers and
  critics as token classifiers (see :mod:`.hf_export`).

Initialising a head: if the directory holds ``score.weight`` (a saved reward model or
critic) it is loaded -- this is how a critic starts from a reward model; otherwise the head
starts at zero for a critic (values start at 0) and small random for a reward model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

HEAD_NAME = "score.weight"


class ScalarHeadModel(nn.Module):
    """Backbone + one scalar per token. ``forward`` returns float ``(B, T)``."""

    def __init__(self, backbone: nn.Module, hidden: int):
        super().__init__()
        self.model = backbone
        self.score = nn.Linear(hidden, 1, bias=False)

    @property
    def config(self):
        return self.model.config

    def gradient_checkpointing_enable(self, **kw: Any) -> None:
        self.model.gradient_checkpointing_enable(**kw)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        # a fresh tensor, not a view: FSDP2 warns about (and mishandles in-place ops on) view outputs
        return self.score(out.last_hidden_state).squeeze(-1).to(torch.float32, copy=True)


def read_hf_tensor(path: str | Path, name: str) -> torch.Tensor | None:
    """One tensor from a HF directory's safetensors (single file or indexed shards), or None."""
    from rlweave.backend_helpers.hf_dir import HFReader

    try:
        with HFReader(path) as read:
            return read(name)
    except FileNotFoundError:
        return None


def load_model(model_cfg: dict[str, Any], attn_impl: str, dtype: torch.dtype, seed: int) -> nn.Module:
    """Build the model described by ``ctx.model`` on CPU in ``dtype`` (same on all ranks)."""
    from transformers import AutoModel, AutoModelForCausalLM

    path = model_cfg.get("path")
    if not path or not Path(path).is_dir():
        raise FileNotFoundError(f"fsdp backend: model.path {path!r} is not a local directory (no hub downloads)")
    kind = model_cfg.get("model_type", "causal_lm")
    common = dict(
        dtype=dtype,
        attn_implementation=attn_impl,
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        local_files_only=True,
    )
    if kind == "causal_lm":
        model = AutoModelForCausalLM.from_pretrained(path, **common)
    elif kind in ("value", "reward"):
        backbone = AutoModel.from_pretrained(path, **common)
        hidden = backbone.config.hidden_size
        model = ScalarHeadModel(backbone, hidden).to(dtype)
        w = read_hf_tensor(path, HEAD_NAME)
        bias = read_hf_tensor(path, "score.bias")
        if bias is not None and bias.abs().max() > 0:
            raise ValueError(f"fsdp backend: {path}: score.bias is non-zero; rlweave heads have no bias")
        with torch.no_grad():
            if w is not None:
                if tuple(w.shape) != (1, hidden):
                    raise ValueError(f"fsdp backend: {path}: score.weight has shape {tuple(w.shape)}, want (1, {hidden})")
                model.score.weight.copy_(w.to(dtype))
            elif kind == "value":
                model.score.weight.zero_()
            else:
                gen = torch.Generator().manual_seed(seed)
                model.score.weight.copy_((torch.randn(1, hidden, generator=gen) / (hidden + 1) ** 0.5).to(dtype))
    else:
        raise ValueError(f"fsdp backend: unknown model_type {kind!r} (choose causal_lm, value, reward)")
    model.config.use_cache = False
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (each becomes one FSDP unit)."""
    base = model.model if hasattr(model, "model") else model
    base = getattr(base, "model", base) if not hasattr(base, "layers") else base
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"fsdp backend: cannot find decoder layers in {type(model).__name__}")
    return list(layers)


def tied_lm_head(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    return bool(getattr(cfg, "tie_word_embeddings", False)) and hasattr(model, "lm_head")


def compile_units(layer: nn.Module, scope: str) -> list[nn.Module]:
    """What ``compile`` compiles in one decoder layer: the layer itself (``layer``), or its
    children other than the attention block (``mlp_norms``: norms and MLP in Llama-style
    layers)."""
    if scope == "layer":
        return [layer]
    if scope != "mlp_norms":
        raise ValueError(f"fsdp backend: compile_scope {scope!r}; choose auto, layer or mlp_norms")
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        raise ValueError(f"fsdp backend: compile_scope mlp_norms: {type(layer).__name__} has no self_attn; use layer")
    return [m for m in layer.children() if m is not attn]
