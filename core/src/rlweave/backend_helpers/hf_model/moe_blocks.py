"""Finding the mixture-of-experts blocks of a Hugging Face model.

An MoE block is a module with a router child ``gate`` (a ``(num_experts, hidden)`` weight;
its forward returns the router logits, alone or first of a tuple) and an ``experts`` child:
the sparse blocks of transformers' Qwen2-MoE, Qwen3-MoE and Mixtral. A backend that trains
them uses the blocks (the FSDP backend's router loss and kernels); one that does not refuses a
model that has any.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class MoEBlock:
    """One sparse block: its module path, router, experts, expert count and top-k."""

    name: str
    router: nn.Module
    experts: nn.Module
    num_experts: int
    top_k: int


def find_blocks(model: nn.Module) -> list[MoEBlock]:
    """The MoE blocks of ``model`` in module order (empty for a dense model)."""
    cfg = getattr(model, "config", None)
    out = []
    for name, m in model.named_modules():
        router, experts = getattr(m, "gate", None), getattr(m, "experts", None)
        if not isinstance(router, nn.Module) or not isinstance(experts, nn.Module):
            continue
        w = getattr(router, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            continue
        top_k = getattr(router, "top_k", None) or getattr(m, "top_k", None) or getattr(cfg, "num_experts_per_tok", 0)
        if not top_k:
            continue
        out.append(MoEBlock(name, router, experts, int(w.shape[0]), int(top_k)))
    return out
