"""The per-expert reference: one plain loop over the experts (the oracle of the tests), the
core's :func:`rlweave.backend_helpers.moe.loop_experts` in the kernel's compute dtype. Written
for obviousness, not speed: it syncs with the host once per expert.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlweave.backend_helpers.moe import loop_experts
from rlweave_kernel_moe.dtypes import compute_dtype


def reference_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                      gate_up: torch.Tensor, down: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor]
                      ) -> torch.Tensor:
    """``(T, H)`` output of the experts; same contract as :func:`rlweave_kernel_moe.experts.grouped_experts`."""
    dtype = compute_dtype(hidden, gate_up)
    out = loop_experts(hidden.to(dtype), top_k_index, top_k_weights, gate_up.to(dtype), down.to(dtype), act_fn)
    return out.to(hidden.dtype)
