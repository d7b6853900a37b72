"""Rotary position embedding as one autograd function, for the models prepared with it
(option ``cpu.kernels``).

transformers' ``apply_rotary_pos_emb`` computes ``q * cos + rotate_half(q) * sin`` with a
concatenated copy of each half, and its backward adds a zero-filled slice gradient per
half. :class:`_Rotary` writes each half of the output with one multiply and one
multiply-add straight in the input's memory layout (the projections' ``(B, T, H, D)``
under the ``(B, H, T, D)`` view), and its backward is the inverse rotation done the same
way (fewer copies, faster on CPU: bench/RESULTS.md). Same formula; bf16 results differ by
rounding only. With ``compiled`` (the backend's ``compile`` option) each rotation is one
inductor kernel instead of four eager ones.

Per model, never process-wide: :func:`install` routes the ``apply_rotary_pos_emb`` of the
modules that define a model's layers through a dispatcher (once per module, the way kernel
libraries hook transformers), and registers forward hooks on that model's decoder layers that
make its :class:`Rotary` choice the active one while a layer runs (its forward, and its
recomputation under activation checkpointing). Outside a prepared layer (another model in the
same process, a reference model without the kernels) the dispatcher calls transformers'
original function. Inside one, CPU tensors with full-width rotary take :class:`_Rotary`; any
other call (CUDA, partial rotary, other broadcast layouts) goes to the original function.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from rlweave.backend_helpers.hf_model import inductor


@dataclass(frozen=True)
class Rotary:
    """One model's rotary choice: ``compiled`` rotations are inductor kernels."""

    compiled: bool = False


_ORIGINALS: dict[str, object] = {}  # module name -> transformers' apply_rotary_pos_emb it had
_local = threading.local()  # .stack: the Rotary choices of the prepared layers running in this thread


def active() -> Rotary | None:
    """The rotary choice of the prepared layer running in this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _push(choice: Rotary) -> None:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(choice)


def _pop() -> None:
    _local.stack.pop()


@contextmanager
def running(choice: Rotary) -> Iterator[None]:
    """Inside, routed ``apply_rotary_pos_emb`` calls of this thread use ``choice`` (what a
    prepared layer's hooks do around its forward)."""
    _push(choice)
    try:
        yield
    finally:
        _pop()


def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, inverse: bool) -> torch.Tensor:
    """``x * c + rotate_half(x) * s`` (``inverse``: the transposed rotation, for gradients)."""
    h = x.shape[-1] // 2
    out = torch.empty_like(x)
    x1, x2, o1, o2 = x[..., :h], x[..., h:], out[..., :h], out[..., h:]
    torch.mul(x1, c[..., :h], out=o1)
    torch.mul(x2, c[..., h:], out=o2)
    if inverse:  # d1 = g1 c1 + g2 s2 ; d2 = g2 c2 - g1 s1
        o1.addcmul_(x2, s[..., h:])
        o2.addcmul_(x1, s[..., :h], value=-1)
    else:  # o1 = x1 c1 - x2 s1 ; o2 = x2 c2 + x1 s2
        o1.addcmul_(x2, s[..., :h], value=-1)
        o2.addcmul_(x1, s[..., h:])
    return out


def _rotate_math(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, inverse: bool) -> torch.Tensor:
    """:func:`_rotate` as plain tensor maths, for inductor (fp32 inside, one rounding)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    c1, c2, s1, s2 = c[..., :h].float(), c[..., h:].float(), s[..., :h].float(), s[..., h:].float()
    if inverse:
        o1, o2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
    else:
        o1, o2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    return torch.cat([o1, o2], dim=-1).to(x.dtype)


def _rotation(compiled: bool):
    return inductor.compiled(_rotate_math) if compiled else _rotate


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, compiled):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        ctx.save_for_backward(c, s)
        ctx.compiled = compiled
        rot = _rotation(compiled)
        return rot(q, c, s, False), rot(k, c, s, False)

    @staticmethod
    def backward(ctx, gq, gk):
        c, s = ctx.saved_tensors
        rot = _rotation(ctx.compiled)
        dq = None if gq is None else rot(gq, c, s, True)
        dk = None if gk is None else rot(gk, c, s, True)
        return dq, dk, None, None, None


def _fits(q, k, cos, sin, unsqueeze_dim) -> bool:
    return (unsqueeze_dim == 1 and q.device.type == "cpu" and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3
            and cos.shape == sin.shape and q.shape[-1] == k.shape[-1] == cos.shape[-1] and q.shape[-1] % 2 == 0
            and cos.dtype == q.dtype == k.dtype and not cos.requires_grad and not sin.requires_grad)


@torch.compiler.disable  # eager kernels (out= views) and a per-thread lookup; in a compiled layer a graph break
def _dispatch(original, q, k, cos, sin, unsqueeze_dim=1, **kwargs):
    choice = active()
    if choice is None or kwargs or not _fits(q, k, cos, sin, unsqueeze_dim):
        return original(q, k, cos, sin, unsqueeze_dim, **kwargs)
    return _Rotary.apply(q, k, cos, sin, choice.compiled)


def _wrap(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, **kwargs):
        return _dispatch(original, q, k, cos, sin, unsqueeze_dim, **kwargs)

    return apply_rotary_pos_emb


def _route(model: nn.Module) -> list[str]:
    """Route ``apply_rotary_pos_emb`` of each module defining a layer class of ``model``
    through :func:`_dispatch` (once per module); returns the module names routed now."""
    routed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        mod = sys.modules.get(name)
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if fn is None or name in _ORIGINALS or not callable(fn):
            continue
        _ORIGINALS[name] = fn
        mod.apply_rotary_pos_emb = _wrap(fn)
        routed.append(name)
    return routed


def original(module_name: str):
    """transformers' ``apply_rotary_pos_emb`` of ``module_name`` before :func:`install` routed
    it, or None if it was not routed."""
    return _ORIGINALS.get(module_name)


def install(model: nn.Module, layers: list[nn.Module], compiled: bool = False) -> list[str]:
    """Use :class:`_Rotary` (inductor kernels with ``compiled``) in ``model``'s decoder
    ``layers`` while they run; other models keep transformers' function. Call once per model
    (before compiling or sharding it). Returns the names of the modules routed now (empty when
    an earlier model already routed them)."""
    choice = Rotary(compiled=compiled)

    def enter(module, args):
        _push(choice)

    def leave(module, args, output):
        _pop()

    for layer in layers:
        layer.register_forward_pre_hook(torch.compiler.disable(enter))
        layer.register_forward_hook(torch.compiler.disable(leave), always_call=True)
    return _route(model)
