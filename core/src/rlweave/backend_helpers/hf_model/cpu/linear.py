"""Linear layers laid out for CPU bf16 training (option ``cpu.kernels``).

On CPU, oneDNN's bf16 matmul runs a weight gradient ``grad_out.t() @ x`` (both operands
``(tokens, features)``, the reduction over tokens) slower than the forward and
input-gradient matmuls: the transposed left operand is the slow layout. Copying the
narrower operand to its transpose first and multiplying in the fast layout wins for the
wide layers and loses for square ones (``bench/cpu_matmul.py``; bench/RESULTS.md).

:func:`install` patches the wide linears of a Llama-style model (Llama, Qwen2/3, Mistral):
the MLP's bias-free ``gate_proj``, ``up_proj``, ``down_proj`` and the LM head, whose
narrow side is the hidden size. The attention projections keep ``nn.Linear``: with both
sides of similar width the copy costs more than it saves. Parameters and their names are
unchanged; results are those of ``nn.Linear`` up to float summation order.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


class _Linear(torch.autograd.Function):
    """``x @ w.t()`` without bias; the weight gradient multiplies with the narrower of
    ``x`` and ``grad_out`` transposed into a contiguous copy."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        out_f, in_f = w.shape
        g2 = grad.reshape(-1, out_f)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = (g2 @ w).view(x.shape)
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, in_f)
            if in_f <= out_f:
                dw = (x2.t().contiguous() @ g2).t().contiguous()
            else:
                dw = g2.t().contiguous() @ x2
        return dx, dw


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` (no bias) with the CPU-friendly weight gradient."""
    return _Linear.apply(x, w)


def _forward(self, x):
    return linear(x, self.weight)


def _wide(m: nn.Module) -> list[nn.Linear]:
    """The projections of a Llama-style MLP (bias-free gate_proj, up_proj, down_proj)."""
    parts = [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return parts if all(isinstance(p, nn.Linear) and p.bias is None for p in parts) else []


def install(model: nn.Module) -> int:
    """Patch the MLP projections and a bias-free ``lm_head`` of ``model`` in place (before
    compiling or sharding); returns how many linears were patched (0: none qualifies)."""
    targets = [p for m in model.modules() for p in _wide(m)]
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear) and head.bias is None:
        targets.append(head)
    n = 0
    for lin in targets:
        if "forward" not in lin.__dict__:  # not patched yet
            lin.forward = types.MethodType(_forward, lin)
            n += 1
    return n
