"""``roles.<role>.lora.target_modules`` checked against the model at validation time.

The model is built from its directory's ``config.json`` on the ``meta`` device (transformers'
``from_config`` under ``torch.device("meta")``): no weights are read and no memory is
allocated, so ``rlweave validate`` refuses a module name the model lacks in about a second
instead of the run failing when its ranks build the model. Light at import: torch and
transformers are imported only when a role lists its target modules and its model directory
is local (``all-linear`` needs no check).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=8)
def _linear_names(config_dir: str, mtime: float) -> tuple[str, ...] | None:
    """The distinct last names of the linear layers of the causal LM in ``config_dir`` (None when
    transformers cannot build it from its config alone); ``mtime`` keys the cache."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(config_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build here: the ranks will say why
        return None
    from rlweave_backend_fsdp.lora import linear_names

    return tuple(linear_names(model))


def lora_target_problems(role: str, section: Any, model: Any) -> list[tuple[str, str]]:
    """``(roles.<role>.lora.target_modules, message)`` for each name in ``target_modules`` that
    is no linear layer of the role's model (a local model directory with a ``config.json``;
    anything else is left to the input checks and the ranks)."""
    from rlweave.interfaces.lora import ALL_LINEAR

    lora = getattr(section, "lora", None)
    if lora is None or lora.target_modules == ALL_LINEAR:
        return []
    path = getattr(model, "path", None)
    config = Path(path) / "config.json" if path else None
    if config is None or not config.is_file():
        return []
    names = _linear_names(str(config.parent.resolve()), config.stat().st_mtime)
    if names is None:
        return []
    key = f"roles.{role}.lora.target_modules"
    return [(key, f"role {role!r}: no linear layer named {t!r} in model {path}; its linear layers are: "
                  f"{', '.join(names)}") for t in lora.target_modules if t not in names]
