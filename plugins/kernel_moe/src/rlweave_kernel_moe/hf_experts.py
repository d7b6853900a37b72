"""Finding the Hugging Face experts modules the grouped implementation can replace.

An experts module holds the stacked weights of all experts of one MoE layer as parameters
``gate_up_proj`` ``(E, 2I, H)`` (gate rows first, then up rows) and ``down_proj``
``(E, H, I)``, plus an ``act_fn``, and is called as ``forward(hidden_states (T, H),
top_k_index (T, k), top_k_weights (T, k)) -> (T, H)`` (transformers 5: ``Qwen3MoeExperts``,
``Qwen2MoeExperts``, ``MixtralExperts`` and the other classes decorated with
``use_experts_implementation``). Variants with another math (biases, transposed or
interleaved weights, no gate, a custom ``_apply_gate``, expert parallelism) are left alone,
with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

#: classes known to have this layout and math even without transformers' decorator flags
KNOWN_CLASSES = ("Qwen3MoeExperts", "Qwen2MoeExperts", "MixtralExperts")


def looks_like_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds stacked 3-D ``gate_up_proj`` and ``down_proj`` parameters."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)
            and gate_up.dim() == 3 and down.dim() == 3)


def _default_apply_gate():
    try:
        from transformers.integrations.moe import _default_apply_gate as fn
    except Exception:  # noqa: BLE001 - a transformers without it: no custom gates to tell apart
        return None
    return fn


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why the grouped implementation cannot stand in for this experts module, or None."""
    cls = type(module).__name__
    decorated = hasattr(module, "has_gate") and hasattr(module, "is_transposed")
    if not decorated and cls not in KNOWN_CLASSES:
        return (f"{cls} is not a transformers experts module (no use_experts_implementation flags) nor one of "
                f"{', '.join(KNOWN_CLASSES)}")
    flags = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
             "_is_expert_parallel": False}
    for flag, wanted in flags.items():
        if getattr(module, flag, wanted) != wanted:
            return f"{cls} has {flag}={getattr(module, flag)} (only {flag}={wanted} is supported)"
    for bias in ("gate_up_proj_bias", "down_proj_bias"):
        if getattr(module, bias, None) is not None:
            return f"{cls} has {bias} (experts with biases are not supported)"
    default_gate = _default_apply_gate()
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and default_gate is not None and gate is not default_gate:
        return f"{cls} has its own _apply_gate (only act(gate) * up is supported)"
    if not callable(getattr(module, "act_fn", None)):
        return f"{cls} has no callable act_fn"
    gate_up, down = module.gate_up_proj, module.down_proj
    e, two_i, h = gate_up.shape
    if down.shape != (e, h, two_i // 2) or two_i % 2:
        return (f"{cls} has gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)}; "
                "expected (E, 2I, H) and (E, H, I)")
    return None


def iter_experts(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str | None]]:
    """``(qualified name, module, reason it is unsupported or None)`` for every module that
    :func:`looks_like_experts`."""
    for name, module in model.named_modules():
        if looks_like_experts(module):
            yield name, module, unsupported_reason(module)
