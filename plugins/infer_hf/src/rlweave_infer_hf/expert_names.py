"""Per-expert checkpoint names onto transformers' stacked MoE expert parameters.

transformers 5 keeps a MoE layer's experts as two stacked parameters,
``<layer>.experts.gate_up_proj`` (experts, 2 x intermediate, hidden) and
``<layer>.experts.down_proj`` (experts, hidden, intermediate), or their transposes where the
experts module says ``is_transposed``. Checkpoints, and the weights a trainer streams, name
each expert's matrices instead: ``<layer>.experts.<e>.gate_proj.weight`` / ``up_proj`` /
``down_proj`` (Qwen2-MoE, Qwen3-MoE and the models sharing their layout) or
``<layer>.block_sparse_moe.experts.<e>.w1`` / ``w3`` / ``w2`` (Mixtral, whose
``block_sparse_moe`` transformers 5 calls ``mlp``). :func:`expert_slot` finds the part of the
stacked parameter such a tensor fills, placed as transformers' own loading places it (gate
rows first, then up rows).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_EXPERT = re.compile(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
#: checkpoint module names that transformers 5 renames (Mixtral)
RENAMES = ((".block_sparse_moe.", ".mlp."),)


def renamed(name: str) -> list[str]:
    """``name`` and its spellings after transformers' module renames, in that order."""
    out = [name]
    for old, new in RENAMES:
        if old in name:
            out.append(name.replace(old, new))
    return out


def expert_slot(model: Any, params: Mapping[str, Any], name: str) -> tuple[str, Any] | None:
    """``(stacked parameter name, view)`` for a per-expert checkpoint ``name``: ``view`` is the
    slice of that parameter's data the tensor fills, shaped like the checkpoint's
    ``(out_features, in_features)`` matrix (copying into it writes the parameter in place).
    None when ``name`` is no per-expert name or the model has no stacked experts for it.
    Raises ``ValueError`` for an expert index beyond the layer's experts."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    part = _PART[match["proj"]]
    for prefix in renamed(match["experts"]):
        key = f"{prefix}.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        param = params.get(key)
        if param is None:
            continue
        expert = int(match["e"])
        if expert >= param.shape[0]:
            raise ValueError(f"{name!r}: expert {expert} does not exist; {key} holds {param.shape[0]} experts")
        view = param.data[expert]
        if getattr(model.get_submodule(prefix), "is_transposed", False):
            view = view.t()
        if part != "down":
            half = view.shape[0] // 2
            view = view[:half] if part == "gate" else view[half:]
        return key, view
    return None
