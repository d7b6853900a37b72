"""Writing a Hugging Face model directory from streamed ``(name, tensor)`` pairs (rank 0 of a
backend's ``save_hf``), and the config it carries.

Layout: ``causal_lm``: the model's own config + ``model*.safetensors``. ``reward``: backbone +
``score.weight`` with ``architectures=[<Arch>ForSequenceClassification]`` and ``num_labels=1``.
``value``: the same plus a zero ``score.bias``, ``architectures=[<Arch>ForTokenClassification]``.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
    # a vision-language model's processor
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
)


def export_config(config: Any, kind: str, dtype: Any, base: str | None = None):
    """A copy of the transformers ``config`` to save with a model of ``kind`` in ``dtype``:
    classification architecture and ``num_labels=1`` for value/reward models, named from
    ``base`` (the backbone class, e.g. ``Qwen2Model``) or else from ``config.architectures``."""
    cfg = copy.deepcopy(config)
    cfg.use_cache = True
    if kind != "causal_lm":
        if base is not None:
            stem = base[: -len("Model")] if base.endswith("Model") else base
        else:
            arch = (getattr(cfg, "architectures", None) or ["Model"])[0]
            stem = arch.split("For")[0] if "For" in arch else arch
        suffix = "ForSequenceClassification" if kind == "reward" else "ForTokenClassification"
        cfg.architectures = [stem + suffix]
        cfg.num_labels = 1
        cfg.classifier_dropout = 0.0
    elif getattr(cfg, "architectures", None) and "ForCausalLM" not in cfg.architectures[0]:
        cfg.architectures = [cfg.architectures[0].split("For")[0] + "ForCausalLM"]
    cfg.dtype = dtype
    return cfg


def write_hf(path: str, items: Iterator[tuple[str, "torch.Tensor"]], config, kind: str, tokenizer_dir: str | None,
             shard_bytes: int) -> None:
    """Rank-0 side of ``save_hf``: write shards as tensors arrive, then index/config/tokenizer."""
    import torch
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


class HFReader:
    """Reads single tensors of a local HF directory (one ``model.safetensors`` or indexed
    shards) by name, keeping the shard files open; ``reader(name)`` is None for a name the
    directory does not hold. Close with :meth:`close` (or use it as a context manager)."""

    def __init__(self, path: str | Path):
        self.root = Path(path)
        index = self.root / "model.safetensors.index.json"
        if index.exists():
            self.where = {k: self.root / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        elif (self.root / "model.safetensors").exists():
            from safetensors import safe_open

            with safe_open(str(self.root / "model.safetensors"), framework="pt") as fh:
                self.where = {k: self.root / "model.safetensors" for k in fh.keys()}
        else:
            raise FileNotFoundError(f"{self.root}: no model.safetensors or model.safetensors.index.json")
        self._open: dict[Path, Any] = {}

    def __call__(self, name: str) -> "torch.Tensor | None":
        f = self.where.get(name)
        if f is None:
            return None
        if f not in self._open:
            from safetensors import safe_open

            self._open[f] = safe_open(str(f), framework="pt")
        return self._open[f].get_tensor(name)

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "HFReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
