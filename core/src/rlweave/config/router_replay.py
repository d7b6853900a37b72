"""The checks of ``algorithm.router_replay`` (MoE router replay, docs/moe.md), before any worker starts.

An algorithm that offers router replay has a ``router_replay`` key (``none``, ``r2``, ``r3``).
Replay needs a mixture-of-experts policy (its ``config.json`` names routed experts), a policy
backend whose record says ``router_replay``, and, for ``r3``, a rollout engine whose record says
``routing`` (it records the experts each token was routed to). Each refusal names its key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEY = "algorithm.router_replay"


def routed_experts(model: Any) -> int | None:
    """Routed experts per layer from a local model directory's config.json (``num_experts`` or
    ``num_local_experts``, in ``text_config`` where it has one); None: dense, or nothing readable."""
    path = getattr(model, "path", None)
    cfg = Path(path) / "config.json" if path else None
    if cfg is None or not cfg.is_file():
        return None
    data = json.loads(cfg.read_text())
    data = data.get("text_config", data)
    n = data.get("num_experts") or data.get("num_local_experts")
    return int(n) if isinstance(n, int) and n > 0 else None


def router_replay_problems(cfg: Any, algo_config: Any, roles: dict[str, Any], rollout_started: bool) -> list[tuple[str, str]]:
    """``[(key, message)]`` for ``algorithm.router_replay`` (empty when off or not offered);
    ``roles``: the resolved records by role; ``rollout_started``: whether a rollout engine runs
    (not with ``rollout.replay``, whose dump brings the routing)."""
    mode = getattr(algo_config, "router_replay", None)
    if mode in (None, "none"):
        return []
    out: list[tuple[str, str]] = []
    policy = cfg.roles.get("policy")
    model = (policy.model if policy is not None and policy.model is not None else cfg.model)
    if model is not None and getattr(model, "path", None) and Path(model.path).is_dir() and not routed_experts(model):
        out.append((KEY, f"router_replay {mode} needs a mixture-of-experts policy; model {model.path} is dense "
                         "(no num_experts in its config.json): set algorithm.router_replay: none"))
    backend = roles.get("policy")
    if backend is not None and not getattr(backend, "router_replay", False):
        out.append((KEY, f"router_replay {mode}: backend {backend.name!r} (roles.policy.backend) does not replay MoE "
                         "routing; use backend fsdp or megatron, or set algorithm.router_replay: none"))
    off_policy = getattr(algo_config, "off_policy", None)
    if mode == "r2" and getattr(off_policy, "mode", None) == "bypass":
        out.append((KEY, "router_replay r2 records the routing in the old-log-prob pass, which "
                         "algorithm.off_policy.mode bypass skips: use r3 (the engine's routing) or mode decoupled"))
    engine = roles.get("rollout") if rollout_started else None
    if mode == "r3" and engine is not None and not getattr(engine, "routing", False):
        out.append(("roles.rollout.engine", f"{KEY} r3 needs the engine's routing: engine {engine.name!r} does not "
                                            "record the experts each token was routed to; use engine hf, or "
                                            "router_replay r2"))
    return out
