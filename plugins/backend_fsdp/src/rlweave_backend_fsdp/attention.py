"""Exact variable-length ("varlen") attention for packed rows, as a transformers attention
implementation named ``rlweave_varlen``.

A packed micro-batch is one row holding several samples; the model is called with
``cu_seq_lens_q/k`` and ``max_length_q/k`` keyword arguments (the same ones transformers'
flash-attention path reads) and with the mask mapping pre-set to ``None`` so no T x T mask
is ever built. Each sample then attends causally to itself only:

* CUDA, bf16/fp16, and ``torch.nn.attention.varlen.varlen_attn`` present: one fused call.
* otherwise (CPU, fp32): causal SDPA per group of equal-length samples (stacked on the
  batch dimension, no padding), which equals padded attention exactly.

Without ``cu_seq_lens_q`` (padded rows) the call is plain SDPA with the padding mask, so
the same model serves both layouts.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

NAME = "rlweave_varlen"
_registered = False


def _varlen_fused():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:  # noqa: BLE001 - older torch
        return None, False
    return varlen_attn, "is_causal" in inspect.signature(varlen_attn).parameters


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface signature; q/k/v are ``(B, H, T, D)``; returns
    ``((B, T, H, D), None)``."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)
    if query.shape[0] != 1:
        raise ValueError(f"{NAME}: packed rows must have batch size 1, got {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    drop = dropout if module.training else 0.0
    fused, has_causal_kw = _varlen_fused()
    if fused is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and drop == 0.0:
        q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, H, D)
        cu32 = cu.to(device=q.device, dtype=torch.int32)
        mx = int(kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max()))
        extra = {"is_causal": True} if has_causal_kw else {"window_size": (-1, 0)}
        if gqa:
            extra["enable_gqa"] = True
        out = fused(q, k, v, cu32, cu32, mx, mx, scale=scaling, **extra)
        return out.unsqueeze(0), None
    return _grouped_sdpa(query, key, value, cu.tolist(), scaling, drop, gqa), None


def _grouped_sdpa(query, key, value, bounds: list[int], scaling, drop: float, gqa: bool) -> torch.Tensor:
    """Causal attention of each packed sample with itself, one SDPA call per sample length.

    Samples of equal length are stacked on the batch dimension (an exact regrouping, no
    padding), so a micro-batch of same-length samples (GRPO groups, ``ignore_eos``) costs one
    call per layer instead of one per sample. The tokens are permuted once (sorted by sample
    length), split per length and permuted back: three gathers and one scatter per layer, whose
    backward is as cheap, where per-sample slices each cost a full-size gradient buffer.
    Inputs ``(1, H, T, D)``; returns ``(1, T, H, D)``."""
    runs, perm, inv = _length_groups(tuple(bounds))
    if perm is not None:
        perm, inv = perm.to(query.device), inv.to(query.device)
        query, key, value = (x.index_select(2, perm) for x in (query, key, value))
    sizes = [n * g for n, g in runs]
    outs = []
    for (n, g), q, k, v in zip(runs, *(x.split(sizes, dim=2) for x in (query, key, value))):
        # (1, H, g*n, D) -> (g, H, n, D)
        q, k, v = (x.reshape(x.shape[1], g, n, x.shape[3]).transpose(0, 1) for x in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, dropout_p=drop, enable_gqa=gqa)
        outs.append(o.transpose(0, 1).reshape(1, o.shape[1], g * n, o.shape[3]))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    if inv is not None:
        out = out.index_select(2, inv)
    return out.transpose(1, 2).contiguous()


@functools.lru_cache(maxsize=16)
def _length_groups(bounds: tuple[int, ...]):
    """The regrouping of :func:`_grouped_sdpa`, computed once per micro-batch layout (all
    layers of a forward share it): ``(runs, perm, inv)`` with ``runs`` the
    ``(length, samples)`` of each equal-length run in length order, ``perm`` the token order
    that sorts samples by length and ``inv`` its inverse (both None when already sorted)."""
    lens = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    order = sorted(range(len(lens)), key=lambda i: (lens[i], i))
    runs: list[tuple[int, int]] = []
    for i in order:
        if runs and runs[-1][0] == lens[i]:
            runs[-1] = (lens[i], runs[-1][1] + 1)
        else:
            runs.append((lens[i], 1))
    if order == list(range(len(lens))):
        return tuple(runs), None, None
    perm = torch.cat([torch.arange(bounds[i], bounds[i + 1]) for i in order])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return tuple(runs), perm, inv


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
