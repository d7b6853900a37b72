"""What validation reads from a local model directory's ``config.json`` (light: no torch):
the language model's part of it (:func:`text_config`) and its routed experts
(:func:`moe_experts`). ``model`` is a role's model section (its ``path``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def text_config(model: Any) -> dict[str, Any] | None:
    """A local model directory's config.json (its ``text_config`` where it has one), or None."""
    path = getattr(model, "path", None)
    cfg = Path(path) / "config.json" if path else None
    if cfg is None or not cfg.is_file():
        return None
    data = json.loads(cfg.read_text())
    return data.get("text_config", data)


def moe_experts(model: Any) -> int | None:
    """Routed experts per MoE layer from a local model directory's config.json
    (``num_experts`` or ``num_local_experts``); None for a dense model or no readable config."""
    data = text_config(model) or {}
    n = data.get("num_experts") or data.get("num_local_experts")
    return int(n) if isinstance(n, int) and n > 0 else None
