"""Full weights out of a sharded model: streaming and Hugging Face export.

Streaming gathers one parameter at a time (``DTensor.full_tensor()``, a collective every
rank joins) and only rank 0 keeps it, so no rank ever holds more than one full tensor
beyond its shard. Names are the HF checkpoint names: the FSDP2 module keeps the original
names, and stacked MoE experts are split per expert (:mod:`.moe_layout`).

Export layout:

* ``causal_lm``: the model's own config + ``model*.safetensors`` (tied ``lm_head.weight``
  left out, as transformers does) -> loads with ``AutoModelForCausalLM`` and vLLM.
* ``reward``: ``model.*`` + ``score.weight`` with ``architectures=[<Arch>ForSequenceClassification]``
  and ``num_labels=1`` -> ``AutoModelForSequenceClassification`` (score at the last token).
* ``value``: same names plus a zero ``score.bias``, ``architectures=[<Arch>ForTokenClassification]``.

A critic is initialised from a reward model simply by pointing its ``model.path`` at the
reward model's export: the backbone and ``score.weight`` are loaded (:mod:`.modeling`).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Iterator

import torch

from rlweave_backend_fsdp.moe_layout import CheckpointLayout

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
)


def stream_full(model: torch.nn.Module, rank: int, skip: set[str], dtype=None, device="cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """All ranks iterate; rank 0 yields ``(name, full tensor)`` parameter by parameter, in
    checkpoint names: stacked MoE experts come out one matrix per expert, each its own copy
    (:mod:`.moe_layout`; raises ValueError for an MoE layout it does not know)."""
    from torch.distributed.tensor import DTensor

    layout = CheckpointLayout(model)
    for name, t in model.state_dict().items():
        if name in skip:
            continue
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if rank == 0:
            src = full.detach()
            local = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage().data_ptr()
            for out_name, part in layout.split(name, src):
                to = dtype if dtype is not None and part.is_floating_point() else part.dtype
                if part is src:
                    out = part.to(to).to(device).contiguous()
                    # one rank: the "full" tensor may be the parameter itself; yield a snapshot
                    yield out_name, (out.clone() if out.untyped_storage().data_ptr() == local else out)
                else:  # a per-expert slice is copied: a consumer keeping it must not pin the stacked tensor
                    yield out_name, part.to(device=device, dtype=to, copy=True).contiguous()
            del src
        del full


def export_config(model: torch.nn.Module, kind: str, dtype: torch.dtype):
    cfg = copy.deepcopy(model.config)
    cfg.use_cache = True
    if kind != "causal_lm":
        base = type(model.model).__name__
        stem = base[: -len("Model")] if base.endswith("Model") else base
        suffix = "ForSequenceClassification" if kind == "reward" else "ForTokenClassification"
        cfg.architectures = [stem + suffix]
        cfg.num_labels = 1
        cfg.classifier_dropout = 0.0
    cfg.dtype = dtype
    return cfg


def write_hf(path: str, items: Iterator[tuple[str, torch.Tensor]], config, kind: str, tokenizer_dir: str | None,
             shard_bytes: int) -> None:
    """Rank-0 side of ``save_hf``: write shards as tensors arrive, then index/config/tokenizer."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    files: list[tuple[str, list[str]]] = []

    def flush() -> None:
        nonlocal size
        if shards[-1]:
            fname = f"part-{len(files):05d}.safetensors"
            save_file(shards[-1], str(root / fname), metadata={"format": "pt"})
            files.append((fname, list(shards[-1])))
            shards[-1] = {}
            size = 0

    for name, t in items:
        if size and size + t.numel() * t.element_size() > shard_bytes:
            flush()
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    if kind == "value":  # token classifiers carry a bias in transformers; ours is zero
        shards[-1]["score.bias"] = torch.zeros(1, dtype=config.dtype)
    flush()
    if len(files) == 1:
        (root / files[0][0]).rename(root / "model.safetensors")
    else:
        names = []
        for i, (fname, keys) in enumerate(files):
            new = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
            (root / fname).rename(root / new)
            names.append((new, keys))
        total = sum((root / f).stat().st_size for f, _ in names)
        index = {"metadata": {"total_size": total}, "weight_map": {k: f for f, ks in names for k in ks}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(str(root))
    if tokenizer_dir and Path(tokenizer_dir).is_dir():
        for f in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / f
            if src.exists():
                shutil.copy2(src, root / f)
