"""Checkpoint names of stacked mixture-of-experts weights.

transformers (5.x) holds the experts of an MoE block stacked: ``<block>.experts.gate_up_proj``
``(E, 2I, H)`` (gate rows first, then up rows) and ``<block>.experts.down_proj`` ``(E, H, I)``.
Checkpoints on disk, ``save_pretrained`` and vLLM's loaders use one matrix per expert instead:

* ``qwen2_moe``, ``qwen3_moe``: ``<block>.experts.<e>.{gate_proj,up_proj,down_proj}.weight``;
* ``mixtral``: the block is named ``block_sparse_moe`` (router ``block_sparse_moe.gate.weight``)
  and the experts ``<block>.experts.<e>.{w1,w3,w2}.weight`` (gate, up, down).

:class:`CheckpointLayout` maps the module's state-dict entries to those names, splitting a
stacked tensor into per-expert copies. It is used for everything that leaves the backend in
HF names (weight streaming, ``save_hf``); the internal DCP checkpoint keeps the module's names.
A model with stacked experts of another type is refused with an error naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ExpertNames:
    """A model type's checkpoint names: the block's module name (None: unchanged) and each
    expert's gate, up and down matrices."""

    block: str | None
    gate: str
    up: str
    down: str


LAYOUTS: dict[str, ExpertNames] = {
    "qwen2_moe": ExpertNames(None, "gate_proj.weight", "up_proj.weight", "down_proj.weight"),
    "qwen3_moe": ExpertNames(None, "gate_proj.weight", "up_proj.weight", "down_proj.weight"),
    "mixtral": ExpertNames("block_sparse_moe", "w1.weight", "w3.weight", "w2.weight"),
}


def _stacked_blocks(model: nn.Module) -> list[str]:
    """Module paths of the blocks whose ``experts`` child holds 3-D (stacked) parameters."""
    out = []
    for name, m in model.named_modules():
        experts = getattr(m, "experts", None)
        if isinstance(experts, nn.Module) and any(p.dim() == 3 for p in experts.parameters(recurse=False)):
            out.append(name)
    return out


class CheckpointLayout:
    """Maps ``model``'s state-dict names to checkpoint names (identity for a dense model or
    per-expert modules). Raises ValueError for stacked experts of an unknown model type or
    shape."""

    def __init__(self, model: nn.Module):
        self.blocks = _stacked_blocks(model)
        self.names: ExpertNames | None = None
        if not self.blocks:
            return
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in LAYOUTS:
            raise ValueError(f"fsdp backend: no checkpoint layout known for the stacked experts of model type "
                             f"{model_type!r} (blocks {', '.join(self.blocks[:2])}...); HF export and weight "
                             f"streaming support {', '.join(sorted(LAYOUTS))}")
        self.names = LAYOUTS[model_type]
        for block in self.blocks:
            experts = model.get_submodule(block).experts
            shapes = {n: tuple(p.shape) for n, p in experts.named_parameters(recurse=False)}
            gu, dn = shapes.get("gate_up_proj"), shapes.get("down_proj")
            if (set(shapes) != {"gate_up_proj", "down_proj"} or len(gu or ()) != 3 or len(dn or ()) != 3
                    or gu[0] != dn[0] or gu[1] != 2 * dn[2] or gu[2] != dn[1]):
                raise ValueError(f"fsdp backend: {block}.experts of model type {model_type!r} has parameters "
                                 f"{shapes}; expected gate_up_proj (E, 2I, H) and down_proj (E, H, I)")
        self._prefixes = sorted((b + "." for b in self.blocks), key=len, reverse=True)

    def _rename(self, block: str) -> str:
        if self.names is None or self.names.block is None:
            return block
        head, _, _ = block.rpartition(".")
        return f"{head}.{self.names.block}" if head else self.names.block

    def split(self, name: str, full: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """``(checkpoint name, tensor)`` for the state-dict entry ``name`` holding ``full``:
        one pair, or one per expert (views of ``full``) for a stacked entry."""
        if self.names is None:
            yield name, full
            return
        prefix = next((p for p in self._prefixes if name.startswith(p)), None)
        if prefix is None:
            yield name, full
            return
        block, rest = prefix[:-1], name[len(prefix):]
        out = self._rename(block)
        n = self.names
        if rest == "experts.gate_up_proj":
            half = full.shape[1] // 2
            for e in range(full.shape[0]):
                yield f"{out}.experts.{e}.{n.gate}", full[e, :half]
                yield f"{out}.experts.{e}.{n.up}", full[e, half:]
        elif rest == "experts.down_proj":
            for e in range(full.shape[0]):
                yield f"{out}.experts.{e}.{n.down}", full[e]
        else:
            yield f"{out}.{rest}", full
