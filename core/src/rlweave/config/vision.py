"""The checks of a run on a vision-language model (docs/vision.md), before any worker starts.

A model directory whose ``config.json`` has a ``vision_config`` is a vision-language model
(:func:`rlweave.data.vision.is_vision_model`). Every role that loads one needs a backend or an
engine whose record says ``vision``; its head must be ``causal_lm``; and what does not carry
images yet is refused by key: partial rollout (``rollout.partial``), multi-turn episodes and
agents (``algorithm.multi_turn``). Imports no torch.
"""

from __future__ import annotations

from typing import Any

from rlweave.data.vision import is_vision_model


def role_model(cfg: Any, role: str) -> Any:
    """The model section role ``role`` loads (its own, else the run's)."""
    section = cfg.roles.get(role)
    own = getattr(section, "model", None) if section is not None else None
    return own if own is not None and getattr(own, "path", None) else cfg.model


def vision_problems(cfg: Any, algo_config: Any, roles: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(key, message)]`` for the roles that load a vision-language model; ``roles``: the
    resolved records by role (backend or engine)."""
    out: list[tuple[str, str]] = []
    any_vision = False
    for role, record in roles.items():
        model = role_model(cfg, role)
        path = getattr(model, "path", None)
        if not path or not is_vision_model(path):
            continue
        any_vision = True
        key = "engine" if getattr(record, "kind", "") == "engine" else "backend"
        if not getattr(record, "vision", False):
            out.append((f"roles.{role}.{key}", f"model {path} is a vision-language model, which {key} "
                                               f"{record.name!r} does not take (those that do: see "
                                               "`rlweave list-plugins`, column vision)"))
        kind = getattr(model, "model_type", "causal_lm")
        if kind != "causal_lm":
            out.append((f"roles.{role}.model.model_type", f"a {kind} head on the vision-language model {path} is not "
                                                          "supported; only causal_lm"))
    if any_vision:
        if getattr(getattr(cfg, "rollout", None), "partial", None) is not None:
            out.append(("rollout.partial", "partial rollout does not carry images yet; remove it for a "
                                           "vision-language model"))
        if getattr(algo_config, "multi_turn", None) is not None:
            out.append(("algorithm.multi_turn", "multi-turn episodes and agents do not carry images yet; remove it "
                                                "for a vision-language model"))
    return out
