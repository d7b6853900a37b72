"""Exact variable-length ("varlen") attention for packed rows, as a transformers attention
implementation named ``rlweave_varlen``.

A packed micro-batch is one row holding several samples; the model is called with
``cu_seq_lens_q/k`` and ``max_length_q/k`` keyword arguments (the same ones transformers'
flash-attention path reads) and without a mask: the mask builder registered with it
(:func:`padding_mask`) builds none for such rows, so no T x T mask is ever built. Each
sample then attends causally to itself only:

* CUDA, bf16/fp16, and ``torch.nn.attention.varlen.varlen_attn`` present: one fused call.
* otherwise: causal attention per group of equal-length samples (stacked on the batch
  dimension, no padding), which equals padded attention exactly.

A row may also share prompt tokens between samples (:mod:`.prefix`): the model is then
called with ``rlweave_plan``, an :class:`AttentionPlan` in which a continuation segment (one
sample's response) attends to all of its prefix segment (the shared prompt) and causally to
itself, which is exactly what the unshared sample's attention computes for those tokens.

On CPU (without dropout) the kernels are those of :mod:`.cpu.attention`, run as the registry
there says for the calling attention module (how a prepared model's modules run is chosen by
:func:`rlweave.backend_helpers.hf_model.cpu.prepare`).

Without ``cu_seq_lens_q`` (padded rows) the call is plain SDPA with the padding mask, so
the same model serves both layouts.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F

from rlweave.backend_helpers.hf_model.cpu import attention as cpu_attention

NAME = "rlweave_varlen"
_registered = False


class SequenceSplit(Protocol):
    """What the model is called with as ``rlweave_sp`` when each rank holds a slice of the
    row (a backend's sequence parallelism, e.g. the FSDP backend's Ulysses group)."""

    def attend(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
               inner: Callable[..., tuple[torch.Tensor, None]], **kwargs: Any) -> tuple[torch.Tensor, None]:
        """Attention of this rank's slice ``(1, H, T/N, D)`` through ``inner`` (this module's
        :func:`varlen_attention_forward`) over the whole row that ``kwargs`` describe; returns
        ``((1, T/N, H, D), None)``."""


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
    ``((B, T, H, D), None)``. With ``rlweave_sp`` (a :class:`SequenceSplit`), the inputs are
    this rank's slice of the row and the plan or ``cu_seq_lens_q`` describe the whole padded
    row."""
    sp = kwargs.pop("rlweave_sp", None)
    if sp is not None:
        return sp.attend(module, query, key, value, attention_mask, varlen_attention_forward, scaling=scaling,
                         dropout=dropout, **kwargs)
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
    return planned_sdpa(query, key, value, plan, scaling, drop, gqa, cpu_attention.modes_of(module)), None


@dataclass(frozen=True)
class Bucket:
    """``g`` segments attended in one kernel call: ``n_q`` queries each, over ``n_k`` keys.

    ``q_idx`` holds the row positions of the queries (segment-major), as an index tensor or a
    ``(start, stop)`` slice of the row. A segment's own keys are at its query positions;
    ``prefix_idx`` (None: no prefix) holds the row positions of each segment's prefix keys,
    ``n_k - n_q`` per segment (segment-major), attended before its own. ``mask`` is None for
    plain causal attention (``n_q == n_k``), else a bool ``(n_q, n_k)`` mask: every prefix
    key, then causal over the segment itself."""

    g: int
    n_q: int
    n_k: int
    q_idx: torch.Tensor | tuple[int, int]
    prefix_idx: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass(frozen=True)
class AttentionPlan:
    """How to attend a packed row: the buckets, and ``inv`` (the row order of the
    concatenated bucket outputs; None when the buckets' queries already tile the row in
    order, so that they are consecutive slices of it: no gather, no scatter)."""

    buckets: tuple[Bucket, ...]
    inv: torch.Tensor | None


def plan_segments(prefixes: list[tuple[int, int]], conts: list[tuple[int, int, int]]) -> AttentionPlan:
    """Plan for a row made of prefix segments ``(start, length)``, each attending causally to
    itself, and continuation segments ``(prefix_index, start, length)``, each attending to its
    whole prefix and causally to itself. Every row position must be in exactly one segment.
    Segments of equal shape share a bucket (one kernel call): prefixes by length, then
    continuations by (prefix length, length), each in increasing order. A row laid out in
    that order (as :func:`.prefix.share` does) gets a plan without gathers."""
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
        pre = torch.cat([torch.arange(ps, ps + pn) for ps, _ in pairs])
        mask = torch.ones(n, pn + n, dtype=torch.bool).tril(pn)
        buckets.append(Bucket(len(pairs), n, pn + n, _as_slice(q), pre, mask))
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


def padded_plan(plan: AttentionPlan, total: int, pad: int) -> AttentionPlan:
    """``plan`` of a ``total``-token row, extended by ``pad`` tokens at its end that form one
    more causal segment (sequence-parallel padding; nobody reads their outputs)."""
    if not pad:
        return plan
    bucket = Bucket(1, pad, pad, (total, total + pad), None, None)
    inv = None if plan.inv is None else torch.cat([plan.inv, torch.arange(total, total + pad)])
    return AttentionPlan(plan.buckets + (bucket,), inv)


def _as_slice(idx: torch.Tensor) -> torch.Tensor | tuple[int, int]:
    if idx.numel() and int(idx[-1]) - int(idx[0]) + 1 == idx.numel() and torch.equal(
            idx, torch.arange(int(idx[0]), int(idx[0]) + idx.numel())):
        return int(idx[0]), int(idx[0]) + idx.numel()
    return idx


def _rows(x: torch.Tensor, idx) -> torch.Tensor:
    """Rows ``idx`` (a slice or an index tensor) of a ``(T, H, D)`` tensor."""
    if isinstance(idx, tuple):
        return x[idx[0] : idx[1]]
    return x.index_select(0, idx.to(x.device))


def _attend(q, k, v, mask: torch.Tensor | None, scaling, drop: float, gqa: bool,
            cpu_modes: cpu_attention.Modes = cpu_attention.DEFAULT) -> torch.Tensor:
    """Attention of ``(B, H, L, D)`` inputs; ``mask`` bool ``(L, S)`` or None (causal).
    ``cpu_modes``: how a CPU module runs (:class:`.cpu.attention.Modes`)."""
    if q.device.type == "cpu" and drop == 0.0:
        return cpu_attention.attend(q, k, v, mask, scaling, cpu_modes)
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):  # dropout on CPU: fp32 SDPA
        q, k, v = q.float(), k.float(), v.float()
    mask = None if mask is None else mask.to(q.device)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling,
                                       dropout_p=drop, enable_gqa=gqa)
    return o.to(dtype)


def planned_sdpa(query, key, value, plan: AttentionPlan, scaling, drop: float, gqa: bool,
                 cpu_modes: cpu_attention.Modes = cpu_attention.DEFAULT) -> torch.Tensor:
    """Attention of a packed row by ``plan``: one kernel call per bucket, segments stacked on
    the batch dimension (no padding). Inputs ``(1, H, T, D)``; returns ``(1, T, H, D)``.
    ``cpu_modes``: how a CPU module runs (:class:`.cpu.attention.Modes`).

    Works on ``(T, H, D)`` views of the inputs (the layout the projections produce, so
    bucket inputs and outputs are mostly views); a plan without ``inv`` takes its buckets as
    consecutive slices, so the backward concatenates instead of scattering."""
    dtype = query.dtype
    rows = [x[0].transpose(0, 1) for x in (query, key, value)]  # (T, H, D)
    if plan.inv is None:
        sizes = [b.g * b.n_q for b in plan.buckets]
        parts = list(zip(*(x.split(sizes) for x in rows)))
    else:
        parts = [tuple(_rows(x, b.q_idx) for x in rows) for b in plan.buckets]
    outs = []
    for b, (q, k, v) in zip(plan.buckets, parts):
        q, k, v = (x.reshape(b.g, b.n_q, x.shape[1], x.shape[2]) for x in (q, k, v))  # (g, n, H, D)
        if b.prefix_idx is not None:
            pre = b.prefix_idx.to(q.device)
            k, v = (torch.cat([full.index_select(0, pre).view(b.g, b.n_k - b.n_q, *full.shape[1:]), x], dim=1)
                    for full, x in ((rows[1], k), (rows[2], v)))
        o = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), b.mask, scaling, drop, gqa, cpu_modes)
        outs.append(o.transpose(1, 2).reshape(b.g * b.n_q, o.shape[1], o.shape[3]))
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    if plan.inv is not None:
        out = out.index_select(0, plan.inv.to(out.device))
    return out.unsqueeze(0).to(dtype)


def padding_mask(*args, attention_mask=None, **kwargs):
    """``rlweave_varlen``'s mask builder: SDPA's mask for right-padded rows (a 2-D padding
    ``attention_mask``), none otherwise -- packed and shared rows carry their layout in
    ``cu_seq_lens_q`` or ``rlweave_plan``, so a model that builds its mask itself (one not
    taking a pre-set mask mapping, e.g. Qwen3-MoE) builds no T x T mask."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> str:
    """Register ``rlweave_varlen`` with transformers (idempotent); returns its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(NAME, varlen_attention_forward)
        AttentionMaskInterface.register(NAME, padding_mask)
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
