"""What the ``deepspeed`` backend refuses at validation time (light: no torch, no deepspeed).

:func:`check_role` is the backend record's ``check``: it runs in ``rlweave validate`` and before
any worker starts, after the role's options were validated. It refuses ZeRO stage and offload
combinations DeepSpeed does not run, ``ds_config`` keys rlweave sets itself, a ``model.dtype``
other than float32 (bf16 is ``options.mixed_precision``, which keeps fp32 master weights),
mixture-of-experts models (not supported by this backend yet) and an offload that would not fit
in this machine's free memory (:func:`host_bytes`, an estimate from the model's config.json).
"""

from __future__ import annotations

from typing import Any

from rlweave.backend_helpers.hf_model.config_json import moe_experts, text_config

from rlweave_backend_deepspeed import ds_json
from rlweave_backend_deepspeed.config import DeepSpeedConfig

#: host bytes per parameter that an offload keeps: fp32 master weight, fp32 gradient, AdamW's two moments
OPTIMIZER_OFFLOAD_BYTES = 16
#: host bytes per parameter of an offloaded parameter shard (fp32; bf16 with mixed precision)
PARAM_OFFLOAD_BYTES = {"none": 4, "bf16": 2}


def param_count(cfg: dict[str, Any]) -> int | None:
    """Parameters of a dense decoder-only model from its config.json values (embeddings, attention
    with grouped key/value heads and their biases where the model has them, gated MLP, norms, an
    untied LM head), or None when a size is missing."""
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        inter = int(cfg["intermediate_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    if cfg.get("attention_bias", cfg.get("model_type") == "qwen2"):  # Qwen2's q/k/v projections have biases
        attn += heads * head_dim + 2 * kv * head_dim
    per_layer = attn + 3 * h * inter + 2 * h
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return embed + layers * per_layer + h


def host_bytes(options: DeepSpeedConfig, params: int) -> int:
    """Host memory an offload of a ``params``-parameter model holds, summed over the role's ranks
    (each rank holds 1/dp of it): 16 bytes per parameter for the optimizer offload, the
    parameter's own bytes for the parameter offload; 0 without offload."""
    total = 0
    if options.offload_optimizer != "none":
        total += OPTIMIZER_OFFLOAD_BYTES * params
    if options.offload_param != "none":
        total += PARAM_OFFLOAD_BYTES[options.mixed_precision] * params
    return total


def available_host_bytes() -> int:
    """Memory this machine can give now (``psutil.virtual_memory().available``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_role(role: str, section: Any, model: Any) -> list[tuple[str, str]]:
    """``(key path, message)`` for each reason ``role`` cannot run on this backend as
    configured (see the module docstring)."""
    opts = DeepSpeedConfig(**(getattr(section, "options", None) or {}))
    out: list[tuple[str, str]] = []
    at = f"roles.{role}"
    if opts.offload_param != "none" and opts.zero_stage != 3:
        out.append((f"{at}.options.offload_param", f"role {role!r}: parameter offload needs zero_stage: 3 "
                    f"(zero_stage is {opts.zero_stage})"))
    for key, msg in ds_json.conflicts(opts.ds_config):
        out.append((f"{at}.{key}", f"role {role!r}: {msg}"))
    dtype = getattr(model, "dtype", None) or "float32"
    if dtype != "float32":
        where = f"{at}.model.dtype" if getattr(section, "model", None) is not None else "model.dtype"
        out.append((where, f"role {role!r}: the deepspeed backend loads float32 weights (model.dtype {dtype!r}); for "
                    "bf16 set options.mixed_precision: bf16 (bf16 compute, fp32 master weights)"))
    if moe_experts(model):
        out.append((f"{at}.backend", f"role {role!r}: mixture-of-experts models are not supported by the deepspeed "
                    f"backend yet (model {model.path}); use backend: fsdp"))
    cfg = text_config(model)
    n = param_count(cfg) if cfg else None
    need = host_bytes(opts, n) if n else 0
    if need:
        free = available_host_bytes()
        if need > free:
            out.append((f"{at}.options.offload_optimizer" if opts.offload_optimizer != "none"
                        else f"{at}.options.offload_param",
                        f"role {role!r}: offloading a model of about {n / 1e9:.2f}B parameters needs about "
                        f"{need / 2**30:.1f} GiB of host memory, {free / 2**30:.1f} GiB is available here "
                        f"(model {model.path}); offload less or use more nodes"))
    return out
