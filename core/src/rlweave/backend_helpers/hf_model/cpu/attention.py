"""CPU attention kernels of rlweave's varlen attention (:mod:`rlweave.backend_helpers.hf_model.attention`),
and which of them each attention module of a prepared model runs.

The kernel is PyTorch's CPU flash attention with the forward in the inputs' dtype and the
backward in fp32 (:class:`_CPUFlash`: for bf16 that pairing beats both all-bf16 and all-fp32,
bench/RESULTS.md). A module whose :class:`Modes` say ``backward="bf16"`` gets a bf16 backward
instead: the probabilities recomputed from the forward's log-sum-exp, bf16 matmuls around an
fp32 softmax gradient, compiled by inductor into a few fused kernels
(:func:`_bf16_backward_math`; run eagerly it would be slower than the fp32 flash backward).
A module whose modes say ``forward="fp32"`` (a CPU where bf16 is slow, :mod:`.choices`) has
bf16 inputs attended in fp32, forward and backward.

The modes live in a registry keyed by module (:func:`set_modes`, :func:`modes_of`; weak
references, so a model's entries go with it), never on the modules themselves; a module not in
it runs the defaults (``Modes()``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from rlweave.backend_helpers.hf_model import inductor


@dataclass(frozen=True)
class Modes:
    """How one attention module runs on CPU: ``forward`` ``"input"`` (the flash kernel in the
    inputs' dtype) or ``"fp32"`` (bf16/fp16 inputs upcast to fp32, the fp32 backward with
    them); ``backward`` ``"fp32"`` (the fp32 flash kernel) or ``"bf16"``
    (:func:`_bf16_backward_math`, for bf16 inputs; other dtypes keep fp32)."""

    forward: str = "input"
    backward: str = "fp32"

    def __post_init__(self) -> None:
        if self.forward not in ("input", "fp32"):
            raise ValueError(f"CPU attention forward {self.forward!r}; choose input or fp32")
        if self.backward not in ("fp32", "bf16"):
            raise ValueError(f"CPU attention backward {self.backward!r}; choose fp32 or bf16")


DEFAULT = Modes()
_MODES: "weakref.WeakKeyDictionary[torch.nn.Module, Modes]" = weakref.WeakKeyDictionary()


def set_modes(modules, modes: Modes) -> int:
    """Make every attention module in ``modules`` that is not None (those transformers passes
    to the attention function) run ``modes`` on CPU; returns how many were set."""
    chosen = [m for m in modules if m is not None]
    for m in chosen:
        _MODES[m] = modes
    return len(chosen)


def modes_of(module) -> Modes:
    """The modes set for ``module`` (:data:`DEFAULT` if none were)."""
    try:
        return _MODES.get(module, DEFAULT)
    except TypeError:  # not weakly referenceable (not a module): the defaults
        return DEFAULT


def _bf16_backward_math(q, k, v, out, grad, lse, mask, scale: float):
    """Attention gradients from the forward's output and log-sum-exp, for ``(B, H, L, D)``
    ``q``/``out``/``grad`` and ``(B, Hk, S, D)`` ``k``/``v`` (query head ``h`` reads key/value
    head ``h // (H // Hk)``), ``lse`` ``(B, H, L)`` and an additive fp32 ``(L, S)`` ``mask``.

    The matmuls take and give the inputs' dtype (on AMX CPUs far above the fp32 rate), with the
    query heads of one key/value head stacked so each is one batched matmul; the softmax
    and its gradient are fp32 (``P = exp(scale * QK^T + mask - lse)``, ``dS = P * (dP -
    rowsum(dO * O))``), rounded once before their matmuls, as GPU flash attention does."""
    b, h, n, d = q.shape
    hk, s_len = k.shape[1], k.shape[2]
    r = h // hk
    q5 = q.reshape(b, hk, r * n, d)
    g5 = grad.reshape(b, hk, r * n, d)
    scores = torch.matmul(q5, k.transpose(-1, -2)).view(b, hk, r, n, s_len)
    p = torch.exp(scores.float() * scale + mask - lse.view(b, hk, r, n, 1))
    dv = torch.matmul(p.to(q.dtype).view(b, hk, r * n, s_len).transpose(-1, -2), g5)
    dp = torch.matmul(g5, v.transpose(-1, -2)).view(b, hk, r, n, s_len)
    delta = (grad.float() * out.float()).sum(-1).view(b, hk, r, n, 1)
    ds = (p * (dp.float() - delta) * scale).to(q.dtype).view(b, hk, r * n, s_len)
    dq = torch.matmul(ds, k).view(b, h, n, d)
    dk = torch.matmul(ds.transpose(-1, -2), q5)
    return dq, dk, dv


class _CPUFlash(torch.autograd.Function):
    """PyTorch's CPU flash-attention kernel, forward in the inputs' dtype and backward in
    fp32. On CPU the bf16 forward is faster than fp32, but the bf16 backward is slower than
    fp32 (bench/RESULTS.md, ``bench/cpu_attention.py``), so the backward upcasts: it is the fp32
    kernel's backward from the bf16 forward's output and log-sum-exp (the flash-attention
    recipe of keeping the output in the input dtype). Inputs ``(B, H, L, D)`` (any strides
    with a contiguous last dimension; fewer key/value heads than query heads allowed);
    ``mask`` an additive fp32 (fp64 for fp64 inputs) ``(L, S)`` mask, or None for causal attention.
    ``backward="bf16"`` with bf16 inputs: :func:`_bf16_backward_math`, compiled, instead of the
    fp32 kernel."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, backward="fp32"):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.scale, ctx.low = mask, scale, backward == "bf16" and q.dtype == torch.bfloat16
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        if ctx.low:
            n = q.shape[2]  # causal buckets: L == S
            mask = ctx.mask
            if mask is None:
                mask = _additive(torch.ones(n, n, dtype=torch.bool).tril_(), lse.dtype)
            scale = ctx.scale if ctx.scale is not None else q.shape[-1] ** -0.5
            args = (_dense(x) for x in (q, k, v, out, grad, lse, mask))
            dq, dk, dv = inductor.compiled(_bf16_backward_math)(*args, float(scale))
            return dq, dk, dv, None, None, None
        wide = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *(x.to(wide) for x in (grad, q, k, v, out)), lse, 0.0, ctx.mask is None,
            attn_mask=None if ctx.mask is None else ctx.mask.to(wide), scale=ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, with row-major strides (size-1 dimensions included): the compiled backward
    then sees one layout and one ``requires_grad`` for every bucket, where dynamo would guard on
    each view's strides and compile again for every new one, up to its recompile limit."""
    x = x.detach()
    want, step = [], 1
    for n in reversed(x.shape):
        want.append(step)
        step *= n
    if x.stride() == tuple(reversed(want)):
        return x
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``allowed`` -> additive mask: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))


def attend(q, k, v, mask: torch.Tensor | None, scaling, modes: Modes = DEFAULT) -> torch.Tensor:
    """Attention without dropout of CPU ``(B, H, L, D)`` inputs (fewer key/value heads allowed);
    ``mask`` bool ``(L, S)`` or None (causal); run as ``modes`` say."""
    wide = torch.promote_types(q.dtype, torch.float32)
    additive = None if mask is None else _additive(mask, wide)
    if modes.forward == "fp32" and q.dtype != wide:
        return _CPUFlash.apply(q.to(wide), k.to(wide), v.to(wide), additive, scaling, "fp32").to(q.dtype)
    return _CPUFlash.apply(q, k, v, additive, scaling, modes.backward)
