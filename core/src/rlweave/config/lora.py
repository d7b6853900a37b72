"""LoRA in a run's config (light: no torch): which roles may train adapters, and whether the
reference role is the policy with its adapters disabled.

``algorithm.reference`` (``auto`` | ``adapter_disabled`` | ``role``) decides where reference
log-probs come from when the algorithm needs a ``reference`` role. ``adapter_disabled`` serves
them from the policy's own ranks with the LoRA adapters switched off, which is exactly the
policy's base model: no reference role is placed or started
(:class:`rlweave.scheduler.views.AdaptersDisabled` stands in for it). It is valid when the
policy trains LoRA adapters and the reference model, if ``roles.reference`` names one, is the
policy's base model (same path, revision and head). ``auto`` picks it whenever it is valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REFERENCE = "reference"
POLICY = "policy"


def _model(cfg: Any, role: str) -> Any:
    sec = cfg.roles.get(role)
    return sec.model if sec is not None and sec.model is not None else cfg.model


def _same_base(cfg: Any) -> str | None:
    """None when the reference model is the policy's base model, else why not."""
    if REFERENCE not in cfg.roles:
        return None
    ref, pol = _model(cfg, REFERENCE), _model(cfg, POLICY)
    for key in ("path", "revision", "model_type"):
        if getattr(ref, key) != getattr(pol, key):
            return (f"the reference model's {key} ({getattr(ref, key)!r}) differs from the policy's "
                    f"({getattr(pol, key)!r})")
    return None


def reference_from_policy(cfg: Any, role_names: Sequence[str]) -> tuple[bool, list[tuple[str, str]], list[str]]:
    """``(use the policy with adapters disabled, problems, warnings)`` for a run whose
    algorithm needs ``role_names``. Problems are ``(dotted path, message)``."""
    mode = cfg.algorithm.reference
    if REFERENCE not in role_names:
        return False, [], []
    policy = cfg.roles.get(POLICY)
    lora = policy.lora if policy is not None else None
    why = "the policy trains no LoRA adapters (roles.policy.lora is not set)" if lora is None else _same_base(cfg)
    if mode == "role":
        return False, [], []
    if why is not None:
        if mode == "adapter_disabled":
            msg = (f"'adapter_disabled' needs the reference to be the policy's base model with adapters off, but "
                   f"{why}; use algorithm.reference: role")
            return False, [("algorithm.reference", msg)], []
        return False, [], []
    warnings = []
    if REFERENCE in cfg.roles:
        warnings.append("roles.reference: not started: reference log-probs come from the policy's ranks with its LoRA "
                        f"adapters disabled (algorithm.reference: {mode}); set algorithm.reference: role to start it")
    return True, [], warnings


def lora_problems(cfg: Any, records: dict[str, Any], never_trained: dict[str, str]) -> list[tuple[str, str]]:
    """``roles.<r>.lora`` on a role that never trains (``never_trained``: role -> why), has no
    optimizer, or whose backend (``records``: role -> record) builds no adapters."""
    out = []
    for role, section in cfg.roles.items():
        if section.lora is None:
            continue
        path = f"roles.{role}.lora"
        if role in never_trained:
            out.append((path, f"the {role} role never trains ({never_trained[role]}); remove lora"))
            continue
        record = records.get(role)
        if record is not None and not getattr(record, "lora", False):
            out.append((path, (f"{record.kind} '{record.name}' of role {role!r} does not train LoRA adapters; "
                               "remove lora or choose a backend that does (e.g. fsdp)")))
        elif section.optim is None:
            out.append((path, (f"role {role!r} has no optimizer (roles.{role}.optim), so its adapters would never "
                               "train; add optim or remove lora")))
    return out


def adapter_sync_problems(cfg: Any, records: dict[str, Any]) -> list[tuple[str, str]]:
    """``weight_sync.lora: adapter`` needs a LoRA policy and a rollout engine that serves adapters."""
    if cfg.weight_sync.lora != "adapter":
        return []
    out = []
    policy = cfg.roles.get(POLICY)
    if policy is None or policy.lora is None:
        out.append(("weight_sync.lora", ("'adapter' sends the policy's LoRA adapter, but roles.policy.lora is not "
                                         "set; use weight_sync.lora: merged")))
    engine = records.get("rollout")
    if engine is not None and not getattr(engine, "lora", False):
        out.append(("weight_sync.lora", (f"'adapter' needs a rollout engine that serves LoRA adapters; engine "
                                         f"'{engine.name}' does not (use vllm or hf, or weight_sync.lora: merged)")))
    return out
