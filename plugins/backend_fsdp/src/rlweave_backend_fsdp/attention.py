"""Exact variable-length ("varlen") attention for packed rows, as a transformers attention
implementation named ``rlweave_varlen``.

A packed micro-batch is one row holding several samples; the model is called with
``cu_seq_lens_q/k`` and ``max_length_q/k`` keyword arguments (the same ones transformers'
flash-attention path reads) and with the mask mapping pre-set to ``None`` so no T x T mask
is ever built. Each sample then attends causally to itself only:

* CUDA, bf16/fp16, and ``torch.nn.attention.varlen.varlen_attn`` present: one fused call.
* otherwise (CPU, fp32): causal SDPA per group of equal-length samples (stacked on the
  batch dimension, no padding), which equals padded attention exactly.

A row may also share prompt tokens between samples (:mod:`.prefix`): the model is then
called with ``rlweave_plan``, an :class:`AttentionPlan` in which a continuation segment (one
sample's response) attends to all of its prefix segment (the shared prompt) and causally to
itself, which is exactly what the unshared sample's attention computes for those tokens.

On CPU, bf16/fp16 inputs are attended in fp32: forward about as fast, backward 1.4-1.7x
faster than CPU SDPA in bf16 at GRPO shapes (``bench/cpu_attention.py``), and more exact.

Without ``cu_seq_lens_q`` (padded rows) the call is plain SDPA with the padding mask, so
the same model serves both layouts.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "rlweave_varlen"
_registered = False


@functools.lru_cache(maxsize=1)
def _varlen_fused():
    """``(varlen_attn, its keyword names)``, or ``(None, ())`` on a torch without it. The
    keywords differ between torch versions: causality is ``is_causal`` (2.9-2.10) or
    ``window_size=(-1, 0)``, and ``enable_gqa`` exists from 2.12 on."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:  # noqa: BLE001 - older torch
        return None, ()
    return varlen_attn, tuple(inspect.signature(varlen_attn).parameters)


@torch.compiler.disable
def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface signature; q/k/v are ``(B, H, T, D)``; returns
    ``((B, T, H, D), None)``."""
    plan = kwargs.get("rlweave_plan")
    cu = kwargs.get("cu_seq_lens_q")
    if plan is None and cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)
    if query.shape[0] != 1:
        raise ValueError(f"{NAME}: packed rows must have batch size 1, got {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    drop = dropout if module.training else 0.0
    fused, params = _varlen_fused()
    if plan is None and fused is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) \
            and drop == 0.0:
        q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, H, D)
        cu32 = cu.to(device=q.device, dtype=torch.int32)
        mx = int(kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max()))
        extra = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if gqa and "enable_gqa" in params:
            extra["enable_gqa"] = True
        elif gqa:  # no GQA keyword: one key/value head per query head
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        out = fused(q, k, v, cu32, cu32, mx, mx, scale=scaling, **extra)
        return out.unsqueeze(0), None
    if plan is None:
        plan = packed_plan(tuple(cu.tolist()))
    return planned_sdpa(query, key, value, plan, scaling, drop, gqa), None


@dataclass(frozen=True)
class Bucket:
    """``g`` segments attended in one SDPA call: ``n_q`` queries each, over ``n_k`` keys.

    ``q_idx`` holds the row positions of the queries (segment-major), ``kv_idx`` those of the
    keys (None: the queries themselves); either may be a ``(start, stop)`` slice of the row
    instead of an index tensor. ``mask`` is None for plain causal attention (``n_q == n_k``),
    else a bool ``(n_q, n_k)`` mask: every prefix key, then causal over the segment itself."""

    g: int
    n_q: int
    n_k: int
    q_idx: torch.Tensor | tuple[int, int]
    kv_idx: torch.Tensor | tuple[int, int] | None
    mask: torch.Tensor | None


@dataclass(frozen=True)
class AttentionPlan:
    """How to attend a packed row: the buckets, and ``inv`` (the row order of the
    concatenated bucket outputs; None when they are already in row order)."""

    buckets: tuple[Bucket, ...]
    inv: torch.Tensor | None


def plan_segments(prefixes: list[tuple[int, int]], conts: list[tuple[int, int, int]]) -> AttentionPlan:
    """Plan for a row made of prefix segments ``(start, length)``, each attending causally to
    itself, and continuation segments ``(prefix_index, start, length)``, each attending to its
    whole prefix and causally to itself. Every row position must be in exactly one segment.
    Segments of equal shape share a bucket (one SDPA call)."""
    by_len: dict[int, list[int]] = {}
    for s, n in prefixes:
        by_len.setdefault(n, []).append(s)
    by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for p, s, n in conts:
        by_shape.setdefault((prefixes[p][1], n), []).append((prefixes[p][0], s))
    buckets, order = [], []
    for n in sorted(by_len):
        starts = by_len[n]
        q = torch.cat([torch.arange(s, s + n) for s in starts])
        buckets.append(Bucket(len(starts), n, n, _as_slice(q), None, None))
        order.append(q)
    for (pn, n), pairs in sorted(by_shape.items()):
        q = torch.cat([torch.arange(s, s + n) for _, s in pairs])
        kv = torch.cat([torch.cat([torch.arange(ps, ps + pn), torch.arange(s, s + n)]) for ps, s in pairs])
        mask = torch.ones(n, pn + n, dtype=torch.bool).tril(pn)
        buckets.append(Bucket(len(pairs), n, pn + n, _as_slice(q), kv, mask))
        order.append(q)
    perm = torch.cat(order) if order else torch.zeros(0, dtype=torch.long)
    inv = None
    if not torch.equal(perm, torch.arange(perm.numel())):
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
    return AttentionPlan(tuple(buckets), inv)


@functools.lru_cache(maxsize=16)
def packed_plan(bounds: tuple[int, ...]) -> AttentionPlan:
    """Plan of a plain packed row (``cu_seqlens`` bounds: each sample causal on its own),
    computed once per micro-batch layout (all layers of a forward share it)."""
    return plan_segments([(s, e - s) for s, e in zip(bounds[:-1], bounds[1:])], [])


def _as_slice(idx: torch.Tensor) -> torch.Tensor | tuple[int, int]:
    if idx.numel() and int(idx[-1]) - int(idx[0]) + 1 == idx.numel() and torch.equal(
            idx, torch.arange(int(idx[0]), int(idx[0]) + idx.numel())):
        return int(idx[0]), int(idx[0]) + idx.numel()
    return idx


def _take(x: torch.Tensor, idx) -> torch.Tensor:
    if isinstance(idx, tuple):
        return x[:, :, idx[0] : idx[1]]
    return x.index_select(2, idx.to(x.device))


def planned_sdpa(query, key, value, plan: AttentionPlan, scaling, drop: float, gqa: bool) -> torch.Tensor:
    """Attention of a packed row by ``plan``: one SDPA call per bucket, segments stacked on
    the batch dimension (no padding). Inputs ``(1, H, T, D)``; returns ``(1, T, H, D)``."""
    dtype = query.dtype
    if query.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        query, key, value = query.float(), key.float(), value.float()
    outs = []
    for b in plan.buckets:
        kv = b.q_idx if b.kv_idx is None else b.kv_idx
        q = _take(query, b.q_idx)
        k, v = _take(key, kv), _take(value, kv)
        # (1, H, g*n, D) -> (g, H, n, D)
        q = q.reshape(q.shape[1], b.g, b.n_q, q.shape[3]).transpose(0, 1)
        k, v = (x.reshape(x.shape[1], b.g, b.n_k, x.shape[3]).transpose(0, 1) for x in (k, v))
        mask = None if b.mask is None else b.mask.to(q.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling,
                                           dropout_p=drop, enable_gqa=gqa)
        outs.append(o.transpose(0, 1).reshape(1, o.shape[1], b.g * b.n_q, o.shape[3]))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    if plan.inv is not None:
        out = out.index_select(2, plan.inv.to(out.device))
    return out.transpose(1, 2).to(dtype).contiguous()


def register() -> str:
    """Register ``rlweave_varlen`` with transformers (idempotent); returns its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, varlen_attention_forward)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME


def choose(requested: str, device: str) -> str:
    """Map the config's ``attn_implementation`` to a transformers implementation name."""
    if requested == "sdpa":
        return "sdpa"
    if requested == "flash_attention_2":
        return "flash_attention_2"
    if requested == "auto" and device == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except Exception:  # noqa: BLE001
            pass
    return register()
