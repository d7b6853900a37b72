"""Ulysses sequence parallelism (``roles.<role>.parallel.sp``) for the FSDP backend.

A role of ``world`` ranks with ``sp = N`` is cut into groups of ``N`` consecutive ranks (the
dispatcher gives every rank of a group the same data; :mod:`rlweave.scheduler.dispatch`).
Inside a group, each packed micro-batch row is padded to a multiple of ``N`` tokens
(:func:`shard`) and rank ``i`` runs the model on the ``i``-th slice of it, with the slice's
own position ids, so rotary embeddings, projections, MLPs and the head see only ``1/N`` of
the tokens.

Around attention (:func:`attend`), an all-to-all turns the sequence-sharded
``(T/N, H, D)`` query, key and value into head-sharded ``(T, H/N, D)`` tensors: each rank
attends the whole row for ``H/N`` heads with the row's varlen plan, and a second all-to-all
returns its slice of the sequence for all heads. Key/value heads are repeated when there
are fewer than ``N`` of them (``N`` must then be a multiple of their number), which is what
grouped-query attention computes for each query head anyway.

Per-token results are computed on the rank that holds the predicting position and summed
over the group (:func:`combine`). Every rank of the group then holds the same full
per-token outputs and computes the same loss; :func:`combine`'s backward passes the
gradient through unchanged, so each rank backpropagates exactly the part of the loss that
its own tokens produce and the group's gradients add up to the gradient of the loss once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlweave_backend_fsdp.checks import kv_repeat


@dataclass(frozen=True)
class SPGroup:
    """This rank's sequence-parallel group: ``size`` ranks, ``rank`` inside it, and the
    torch.distributed ``group`` (``None`` only in unit tests of the layout)."""

    size: int
    rank: int
    group: Any

    def attend(self, module, query, key, value, attention_mask, inner, **kwargs):
        """:func:`attend` in this group: what the HF model layer's varlen attention calls for
        a model run with ``rlweave_sp`` (:class:`rlweave.backend_helpers.hf_model.attention.SequenceSplit`)."""
        return attend(module, query, key, value, attention_mask, inner, self, **kwargs)


def new_group(world: int, rank: int, sp: int) -> SPGroup | None:
    """Create the groups of ``sp`` consecutive ranks (every rank must call this, in the same
    order) and return this rank's, or ``None`` when ``sp`` is 1."""
    if sp <= 1:
        return None
    if world % sp:
        raise ValueError(f"fsdp backend: parallel.sp={sp} does not divide the role's {world} ranks")
    mine = None
    for start in range(0, world, sp):
        g = dist.new_group(list(range(start, start + sp)))
        if start <= rank < start + sp:
            mine = g
    return SPGroup(sp, rank % sp, mine)


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all over dim 0 (``(N, ...)`` chunks); its own transpose in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    """``(T/N, H, D)`` slice of the row, all heads -> ``(T, H/N, D)`` whole row, this rank's heads."""
    t, h, d = x.shape
    chunks = x.reshape(t, sp.size, h // sp.size, d).transpose(0, 1)  # chunk j: rank j's heads
    return _AllToAll.apply(chunks, sp.group).reshape(sp.size * t, h // sp.size, d)


def heads_to_seq(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    """``(T, H/N, D)`` whole row, this rank's heads -> ``(T/N, H, D)`` this rank's slice, all heads."""
    n, h, d = x.shape
    t = n // sp.size
    got = _AllToAll.apply(x.reshape(sp.size, t, h, d), sp.group)  # chunk j: my tokens, rank j's heads
    return got.transpose(0, 1).reshape(t, sp.size * h, d)


def attend(module, query, key, value, attention_mask, inner, sp: SPGroup, **kwargs):
    """Ulysses around ``inner`` (an attention function of transformers' interface): inputs
    ``(1, H, T/N, D)`` of this rank's slice; ``inner`` runs on ``(1, H/N, T, D)``; returns
    ``((1, T/N, H, D), None)``. ``kwargs`` describe the whole padded row (its plan or
    ``cu_seq_lens_q``)."""
    if query.shape[0] != 1:
        raise ValueError(f"fsdp backend: sequence parallelism needs packed rows (batch size 1), got {query.shape[0]}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (t, H, D)
    r = kv_repeat(q.shape[1], k.shape[1], sp.size)
    if r > 1:
        k, v = (x.repeat_interleave(r, dim=1) for x in (k, v))
    q, k, v = (seq_to_heads(x, sp).transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, h, T, D)
    out, _ = inner(module, q, k, v, attention_mask, **kwargs)  # (1, T, h, D)
    return heads_to_seq(out[0], sp).unsqueeze(0), None


class _SumReplicated(torch.autograd.Function):
    """Sum over the group in forward; identity in backward (every rank computes the same loss
    from the sum, so each rank's own contribution receives the loss's gradient once)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def combine(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    """The group's sum of per-rank partial results (zeros where another rank computes)."""
    return _SumReplicated.apply(x, sp.group)


@dataclass(frozen=True)
class Shard:
    """This rank's slice ``[lo, lo + n)`` of a row padded with ``pad`` tokens to ``N * n``."""

    lo: int
    n: int
    pad: int
    input_ids: torch.Tensor  # (n,)
    position_ids: torch.Tensor  # (n,)


def shard(input_ids: torch.Tensor, position_ids: torch.Tensor, sp: SPGroup, pad_id: int = 0) -> Shard:
    """Pad a row to a multiple of ``sp.size`` (padding: one extra causal segment with
    positions from 0, whose outputs nobody reads) and take this rank's slice."""
    total = int(input_ids.numel())
    pad = (-total) % sp.size
    if pad:
        input_ids = torch.cat([input_ids, torch.full((pad,), pad_id, dtype=input_ids.dtype)])
        position_ids = torch.cat([position_ids, torch.arange(pad, dtype=position_ids.dtype)])
    n = (total + pad) // sp.size
    lo = sp.rank * n
    return Shard(lo, n, pad, input_ids[lo : lo + n], position_ids[lo : lo + n])
