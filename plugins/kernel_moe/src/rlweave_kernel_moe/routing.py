"""Token routing for grouped experts: sort the (token, choice) pairs by expert, and back.

``T`` tokens, each sent to ``k`` experts (``top_k_index``, ``(T, k)``), make ``S = T * k``
pairs; pair ``p = t * k + j`` is token ``t``'s ``j``-th choice. :func:`route` sorts the pairs
by expert (stable: within one expert the pairs keep token order), so each expert's rows form
one contiguous group that a grouped matmul can take whole. :func:`permute` gathers the
hidden states into that order; :func:`unpermute` brings the expert outputs back and sums each
token's ``k`` outputs weighted by its routing weights.

Everything stays on the device: no host synchronisation, so the step can be captured or
overlapped. Expert indices must lie in ``[0, E)`` (expert-parallel sentinels are not
supported). Gradients flow through :func:`permute` into the hidden states and through
:func:`unpermute` into both the expert outputs and the routing weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    """Where each (token, choice) pair goes.

    Attributes:
        order: ``(S,)`` int64, the pair index ``t * k + j`` of the ``i``-th sorted pair.
        token: ``(S,)`` int64, the token of the ``i``-th sorted pair (``order // k``).
        counts: ``(E,)`` int64, pairs (rows) per expert; zero for an expert nobody chose.
        offsets: ``(E,)`` int32, end row of each expert's group in sorted order (the cumulative
            counts): expert ``e`` owns rows ``[offsets[e-1], offsets[e])``, what
            ``torch.nn.functional.grouped_mm`` takes as ``offs``.
        inverse: ``(S,)`` int64, the sorted row of pair ``p`` (``order[inverse[p]] == p``).
        num_tokens: ``T``.
        top_k: ``k``.
    """

    order: torch.Tensor
    token: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    inverse: torch.Tensor
    num_tokens: int
    top_k: int


def route(top_k_index: torch.Tensor, num_experts: int) -> Routing:
    """Sort the pairs of ``top_k_index`` (``(T, k)`` integer) by expert; see :class:`Routing`."""
    num_tokens, top_k = top_k_index.shape
    expert_of_pair = top_k_index.reshape(-1)
    sorted_experts, order = torch.sort(expert_of_pair, stable=True)
    # Number of pairs with expert <= e, for every e: the end of e's group (no bincount: no sync).
    bounds = torch.arange(1, num_experts + 1, device=top_k_index.device, dtype=sorted_experts.dtype)
    ends = torch.searchsorted(sorted_experts, bounds)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return Routing(order=order, token=order // top_k, counts=counts, offsets=ends.to(torch.int32),
                   inverse=inverse, num_tokens=num_tokens, top_k=top_k)


def permute(hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
    """``(T, H)`` -> ``(S, H)``: each pair's token row, in expert order (a fresh, contiguous tensor)."""
    return hidden.index_select(0, routing.token)


def unpermute(rows: torch.Tensor, top_k_weights: torch.Tensor, routing: Routing, out_dtype: torch.dtype) -> torch.Tensor:
    """``(S, H)`` expert outputs in expert order -> ``(T, H)``: ``out[t] = sum_j w[t, j] * row(t, j)``.

    The weighted scatter-add back to the tokens, written as a gather through ``inverse`` and a
    sum over the ``k`` choices: deterministic (no atomics), and the product is taken in the
    promoted dtype of the rows and the weights, as the Hugging Face eager loop does.
    """
    hidden_size = rows.shape[-1]
    per_pair = rows.index_select(0, routing.inverse).view(routing.num_tokens, routing.top_k, hidden_size)
    weighted = per_pair * top_k_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(out_dtype)
