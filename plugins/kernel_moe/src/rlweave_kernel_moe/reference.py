"""The per-expert reference: one plain loop over the experts (the oracle of the tests).

For each expert ``e``: take the (token, choice) pairs routed to it, ``gate, up = (x @
gate_up[e].T).chunk(2)``, ``y = (act(gate) * up) @ down[e].T``, and add ``w * y`` to those
tokens. Written for obviousness, not speed: it syncs with the host once per expert. The
weights are split per expert with ``unbind`` (not ``gate_up[e]``, whose backward would build a
full-size gradient per expert).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlweave_kernel_moe.dtypes import compute_dtype


def reference_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                      gate_up: torch.Tensor, down: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor]
                      ) -> torch.Tensor:
    """``(T, H)`` output of the experts; same contract as :func:`rlweave_kernel_moe.experts.grouped_experts`."""
    dtype = compute_dtype(hidden, gate_up)
    x, gate_up, down = hidden.to(dtype), gate_up.to(dtype), down.to(dtype)
    out = torch.zeros(hidden.shape, dtype=torch.promote_types(dtype, top_k_weights.dtype), device=hidden.device)
    gate_ups, downs = gate_up.unbind(0), down.unbind(0)
    for e in range(len(gate_ups)):
        token, choice = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        gate, up = F.linear(x[token], gate_ups[e]).chunk(2, dim=-1)
        y = F.linear(act_fn(gate) * up, downs[e])
        out = out.index_add(0, token, y * top_k_weights[token, choice, None])
    return out.to(hidden.dtype)
