"""Recording the MoE routing of a transformers ``generate`` call (``SamplingParams.return_routing``).

:class:`GenerateRouting` hooks every MoE block's router (transformers' top-k routers return
``(logits, weights, indices)``) for the length of one call and keeps each forward's indices:
the prefill of the left-padded prompts ``(rows, width)``, then one ``(rows, 1)`` step per
sampled token but the last. :meth:`GenerateRouting.sample` cuts one row's routing out in the
order of :attr:`rlweave.interfaces.engine.Generation.routing`: its prompt tokens (the prefill),
then each response token (the decode step that read it), ``-1`` for the last sampled token (no
forward read it).
"""

from __future__ import annotations

from typing import Any

import torch

from rlweave.backend_helpers.hf_model.moe_blocks import find_blocks
from rlweave.backend_helpers.router_replay import DTYPE, unknown


class GenerateRouting:
    """A context manager recording the routing of one ``generate`` call of ``model`` on ``rows``
    left-padded rows; ValueError for a model without MoE layers."""

    def __init__(self, model: Any, rows: int, where: str):
        self.blocks = find_blocks(model)
        if not self.blocks:
            raise ValueError(f"{where}: routing asked of a model without MoE layers")
        self.rows = rows
        self.top_k = max(b.top_k for b in self.blocks)
        self.steps: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        self._handles: list[Any] = []

    def __enter__(self) -> "GenerateRouting":
        for i, b in enumerate(self.blocks):
            self._handles.append(b.router.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, layer: int):
        def hook(module: Any, args: Any, out: Any) -> None:
            if not isinstance(out, tuple) or len(out) != 3:
                raise TypeError(f"routing: router {type(module).__name__} returns {type(out).__name__}; "
                                "expected (logits, weights, indices)")
            idx = out[2].detach().to("cpu", DTYPE)
            self.steps[layer].append(idx.reshape(self.rows, -1, idx.shape[-1]))

        return hook

    def grid(self) -> torch.Tensor:
        """``(rows, positions, layers, top_k)``: every position the call's forwards read."""
        return torch.stack([torch.cat(s, dim=1) for s in self.steps], dim=2)

    def sample(self, grid: torch.Tensor, row: int, width: int, prompt_len: int, new_tokens: int) -> torch.Tensor:
        """Row ``row``'s routing for its ``prompt_len`` prompt tokens (right-aligned in the
        prefill's ``width``) and ``new_tokens`` response tokens."""
        out = unknown(prompt_len + new_tokens, len(self.blocks), self.top_k)
        have = min(grid.shape[1], width + new_tokens) - (width - prompt_len)
        out[:have] = grid[row, width - prompt_len : width - prompt_len + have]
        return out
