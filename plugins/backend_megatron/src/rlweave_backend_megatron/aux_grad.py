"""The router load-balancing loss's gradient on the MoE layers' own forward, so that it reaches
the routers with activation recomputation too (megatron's ``MoEAuxLossAutoScaler`` idea).

With activation checkpointing megatron runs a layer's forward without a graph and recomputes it
in backward: router logits collected during the forward have no graph, and a loss made of them
gives the routers no gradient. Instead, each MoE layer's output passes through :func:`attach`,
an identity whose backward also gives the layer's router probabilities (fp32 softmax of its
logits, summed over the micro-batch's real tokens) the gradient vector of the load-balancing
loss (:func:`rlweave.backend_helpers.moe.aux_probs_grad`, the same for every row of every
layer). That vector depends on every layer's expert counts, known only once the forward is over:
the worker writes it into the micro-batch's :class:`AuxGrad` after the forward and before the
backward reads it. A recomputed forward in backward attaches again, to its own graph, which the
checkpoint's backward runs through; without recomputation the first forward's node carries it.

Contract: :func:`set_aux` on every MoE layer before each micro-batch's forward (None: nothing
attached), left set until the next micro-batch's (so a recomputation sees it); the loss adds the
aux loss's value without a graph (else its gradient would count twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(eq=False)
class AuxGrad:
    """One micro-batch's attachment: ``rows``, its real tokens' rows in the MoE layers'
    flattened ``(s, b)`` order (:func:`.pipeline.layer_rows`), and ``probs_grad``, the loss's
    gradient ``(E,)`` with respect to a layer's probabilities summed over those rows (set after
    the forward; None: no gradient)."""

    rows: torch.Tensor
    probs_grad: torch.Tensor | None = None


class _Attach(torch.autograd.Function):
    """``out`` unchanged; backward: ``out``'s gradient through, ``state.probs_grad`` to ``probs_sum``."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, probs_sum: torch.Tensor, state: AuxGrad) -> torch.Tensor:
        ctx.state = state
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = ctx.state.probs_grad
        return grad, None if g is None else g.to(grad.device, torch.float32), None


def attach(out: torch.Tensor, probs: torch.Tensor, state: AuxGrad | None) -> torch.Tensor:
    """``out`` (a MoE layer's output) with the load-balancing loss's gradient of ``probs``
    ``(T, E)`` (the layer's fp32 router probabilities, rows in the flattened ``(s, b)`` order)
    attached; ``out`` itself when ``state`` is None or no graph is being built."""
    if state is None or not torch.is_grad_enabled() or not probs.requires_grad:
        return out
    return _Attach.apply(out, probs.index_select(0, state.rows.to(probs.device)).sum(0), state)


def set_aux(mlps: Sequence[Any], rows: torch.Tensor | None) -> AuxGrad | None:
    """A fresh :class:`AuxGrad` of ``rows`` (None: nothing attached) on every MoE layer of
    ``mlps`` (their ``aux`` attribute) until the next call; returns it."""
    state = None if rows is None else AuxGrad(rows)
    for m in mlps:
        m.aux = state
    return state
