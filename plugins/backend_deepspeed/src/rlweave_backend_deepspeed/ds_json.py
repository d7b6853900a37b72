"""The DeepSpeed config the backend builds from a role's settings, and the check of a user's
``options.ds_config`` against it (light: no torch, no deepspeed).

rlweave owns the keys in :data:`OWNED`: the ZeRO stage and offload come from the backend's
options, the precision from ``mixed_precision``, clipping from ``optim.grad_clip``, the
optimizer and its schedule from ``optim`` (a torch AdamW the worker builds), and the batch
shape from rlweave's token-budgeted micro-batches (DeepSpeed sees micro-batches of one
"sample" and an accumulation boundary the worker sets at each ``train_step``). Any other key
of ``ds_config`` is merged in (nested dictionaries key by key).
"""

from __future__ import annotations

from typing import Any

#: ds_config keys (dotted paths) rlweave sets itself, each with the setting that controls it
OWNED: dict[str, str] = {
    "zero_optimization.stage": "options.zero_stage",
    "zero_optimization.offload_optimizer": "options.offload_optimizer",
    "zero_optimization.offload_param": "options.offload_param",
    "bf16": "options.mixed_precision",
    "fp16": "options.mixed_precision (fp16 is not supported; use bf16)",
    "gradient_clipping": "optim.grad_clip",
    "optimizer": "optim (rlweave builds a torch AdamW)",
    "scheduler": "optim.schedule / optim.warmup_steps",
    "train_batch_size": "rlweave's token-budgeted micro-batches (options.max_tokens_per_micro_batch)",
    "train_micro_batch_size_per_gpu": "options.max_tokens_per_micro_batch",
    "gradient_accumulation_steps": "rlweave's micro-batch count, set per train_step",
    "managed_gradient_accumulation": "rlweave's micro-batch count, set per train_step",
    "zero_allow_untested_optimizer": "optim (rlweave builds a torch AdamW)",
    "zero_force_ds_cpu_optimizer": "optim (rlweave builds a torch AdamW)",
}


def _paths(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        p = f"{prefix}{k}"
        out.append(p)
        if isinstance(v, dict):
            out.extend(_paths(v, p + "."))
    return out


def conflicts(user: dict[str, Any]) -> list[tuple[str, str]]:
    """``(ds_config key path, message)`` for each key of ``user`` that rlweave sets itself."""
    out = []
    for path in _paths(user):
        if path in OWNED:
            out.append((f"options.ds_config.{path}", f"is set by rlweave from {OWNED[path]}; set that instead"))
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build(options: Any, grad_clip: float | None) -> dict[str, Any]:
    """The DeepSpeed config for ``options`` (a :class:`~.config.DeepSpeedConfig`) and the role's
    ``optim.grad_clip`` (None or 0: no clipping), with ``options.ds_config`` merged in.
    Raises ValueError naming each conflicting key (see :func:`conflicts`)."""
    bad = conflicts(options.ds_config)
    if bad:
        raise ValueError("; ".join(f"{k} {m}" for k, m in bad))
    zero: dict[str, Any] = {"stage": options.zero_stage}
    if options.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": options.offload_optimizer, "pin_memory": False}
    if options.offload_param != "none":
        zero["offload_param"] = {"device": options.offload_param, "pin_memory": False}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(grad_clip or 0.0),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if options.mixed_precision == "bf16":
        # overflow checks in bf16 too: a non-finite gradient norm skips the step (rlweave's contract)
        cfg["bf16"] = {"enabled": True, "check_grad_overflow": True}
    return _merge(cfg, options.ds_config)
