"""What the ``megatron`` backend refuses at validation time (light: no torch, no megatron).

:func:`check_role` is the backend record's ``check``: it runs in ``rlweave validate`` and before
any worker starts, after the role's options were validated. The core already checks that the
parallel sizes are >= 1 and multiply to the role's ``devices`` (``dp * tp * pp``, or divide it
without ``dp``; ``ep`` divides ``dp``); here is what only this backend knows: the model's shape
must split over ``tp``, ``pp`` and ``ep``, its architecture must be one the backend converts,
Megatron's sequence parallelism needs ``tp > 1``, and mixture-of-experts models run without
pipeline stages or sequence parallelism.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: ``model_type`` values of config.json the backend converts (dense Qwen2/Qwen2.5, Qwen3, Llama family; Qwen3-MoE)
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe")


def read_model_config(model: Any) -> dict[str, Any] | None:
    """A local model directory's config.json as a dict, or None (no local directory, no file).

    Raises ValueError naming the file when it is not a JSON object."""
    path = getattr(model, "path", None)
    cfg = Path(path) / "config.json" if path else None
    if cfg is None or not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cfg} cannot be read as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{cfg} is not a JSON object")
    return data


def text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (its ``text_config`` where it has one)."""
    inner = data.get("text_config")
    return inner if isinstance(inner, dict) else data


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def num_experts(text: dict[str, Any]) -> int | None:
    """Experts per MoE layer of a config.json's language model (``num_experts``, or
    ``num_local_experts`` as transformers 5 writes it), or None for a dense model."""
    return _int(text, "num_experts") or _int(text, "num_local_experts")


def architecture_problems(data: dict[str, Any]) -> list[str]:
    """Why the backend cannot convert a model with this config.json (empty: it can): the
    architecture, mixture-of-experts layers other than Qwen3-MoE's (every layer sparse), an
    activation other than SiLU, Llama biases, a rotary scaling other than the default,
    sliding-window attention."""
    out: list[str] = []
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        out.append(f"architecture {model_type!r} (config.json model_type) is not supported by the megatron "
                   f"backend; supported: {', '.join(SUPPORTED_MODEL_TYPES)} (dense Qwen2/Qwen2.5, Qwen3 and Llama-family "
                   "models, Qwen3-MoE); use backend 'fsdp' for other models")
    text = text_config(data)
    key = next((k for k in ("num_experts", "num_local_experts") if _int(text, k)), None)
    if key and model_type in SUPPORTED_MODEL_TYPES and model_type != "qwen3_moe":
        out.append(f"mixture-of-experts layers in a {model_type} model ({_int(text, key)} experts, config.json {key}) "
                   "are not supported by the megatron backend (Qwen3-MoE is); use backend 'fsdp'")
    if model_type == "qwen3_moe":
        if (_int(text, "decoder_sparse_step") or 1) != 1 or text.get("mlp_only_layers"):
            out.append("Qwen3-MoE with dense layers (config.json decoder_sparse_step != 1 or mlp_only_layers) is not "
                       "supported by the megatron backend (every layer sparse is); use backend 'fsdp'")
        if not num_experts(text) or not _int(text, "num_experts_per_tok"):
            out.append("Qwen3-MoE config.json needs num_experts (or num_local_experts) and num_experts_per_tok")
    if text.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act {text.get('hidden_act')!r} is not supported (only silu, SwiGLU MLPs)")
    if model_type in ("llama", "qwen3", "qwen3_moe") and (text.get("attention_bias") or text.get("mlp_bias")):
        out.append(f"{model_type} with attention_bias or mlp_bias is not supported")
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if kind not in (None, "default"):
        where = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
        out.append(f"rotary scaling {kind!r} (config.json {where}) is not supported yet (only the default rotary "
                   "embedding)")
    if text.get("use_sliding_window"):
        out.append("sliding-window attention (use_sliding_window: true) is not supported")
    return out


def shape_problems(data: dict[str, Any], tp: int, pp: int, ep: int = 1) -> list[tuple[str, str]]:
    """``("parallel.tp" | "parallel.pp" | "parallel.ep" | "model", message)`` for each reason a
    model with this config.json cannot be built by the backend or split over ``tp`` x ``pp``
    (x ``ep`` experts)."""
    out: list[tuple[str, str]] = [("model", m) for m in architecture_problems(data)]
    text = text_config(data)
    experts = num_experts(text) if data.get("model_type") == "qwen3_moe" else None
    if ep > 1 and not experts:
        out.append(("parallel.ep", f"parallel.ep={ep} splits the experts of a mixture-of-experts model; this model is "
                    "dense: remove parallel.ep"))
    if experts and experts % ep:
        out.append(("parallel.ep", f"{experts} experts (config.json num_experts) are not divisible by "
                    f"parallel.ep={ep}"))
    if experts and pp > 1:
        out.append(("parallel.pp", f"mixture-of-experts models run without pipeline stages in the megatron backend "
                    f"(got pp={pp}): the router load-balancing loss pools all layers; use tp, dp and ep"))
    heads = _int(text, "num_attention_heads")
    kv = _int(text, "num_key_value_heads") or heads
    if heads and heads % tp:
        out.append(("parallel.tp", f"{heads} attention heads are not divisible by parallel.tp={tp}"))
    if kv and kv % tp:
        out.append(("parallel.tp", f"{kv} key/value heads are not divisible by parallel.tp={tp}"))
    inter = _int(text, "intermediate_size")
    if inter and inter % tp and not experts:
        out.append(("parallel.tp", f"intermediate_size {inter} is not divisible by parallel.tp={tp}"))
    layers = _int(text, "num_hidden_layers")
    if layers and layers % pp:
        out.append(("parallel.pp", f"{layers} layers (num_hidden_layers) are not divisible by parallel.pp={pp}"))
    return out


def _options(section: Any) -> dict[str, Any]:
    options = getattr(section, "options", None) or {}
    return options if isinstance(options, dict) else options.model_dump()


def check_role(role: str, section: Any, model: Any) -> list[tuple[str, str]]:
    """Every reason ``role`` cannot run on this backend as configured, as ``(key path, message)``:
    ``options.sequence_parallel`` without ``tp > 1``, and, when the model is a local directory
    with a config.json, an unsupported architecture or MoE layout (at ``model.path``, or
    ``roles.<role>.model.path`` for a role's own model), heads, key/value heads or
    ``intermediate_size`` not divisible by ``tp``, layers not divisible by ``pp``, experts not
    divisible by ``ep`` (or ``ep`` for a dense model), an MoE model with ``pp > 1`` or sequence
    parallelism."""
    parallel = dict(getattr(section, "parallel", None) or {})
    tp, pp = max(1, int(parallel.get("tp", 1))), max(1, int(parallel.get("pp", 1)))
    ep = max(1, int(parallel.get("ep", 1)))
    out: list[tuple[str, str]] = []
    if _options(section).get("sequence_parallel") and tp < 2:
        out.append((f"roles.{role}.options.sequence_parallel",
                    f"role {role!r}: megatron's sequence parallelism splits the sequence over the tensor-parallel "
                    f"ranks: it needs parallel.tp > 1 (got tp={tp}); set sequence_parallel: false"))
    model_key = f"roles.{role}.model.path" if getattr(section, "model", None) is not None else "model.path"
    try:
        data = read_model_config(model)
    except ValueError as exc:
        return out + [(model_key, f"role {role!r}: {exc}")]
    if data is None:
        return out
    src = f" (model {model.path})"
    if _options(section).get("sequence_parallel") and num_experts(text_config(data)):
        out.append((f"roles.{role}.options.sequence_parallel",
                    f"role {role!r}: sequence parallelism is not supported for mixture-of-experts models by the "
                    f"megatron backend{src}; set sequence_parallel: false"))
    for key, msg in shape_problems(data, tp, pp, ep):
        path = model_key if key == "model" else f"roles.{role}.{key}"
        out.append((path, f"role {role!r}: {msg}{src}"))
    return out
