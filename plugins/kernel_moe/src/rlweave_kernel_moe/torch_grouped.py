"""Grouped matmul through torch's own ``grouped_mm`` (``torch.nn.functional.grouped_mm``, or
``torch._grouped_mm`` on older torch): one call per projection for all experts.

Rules of that op this module keeps (checked on torch 2.13 CPU; CUDA kernels are stricter
about dtypes on older torch, which :func:`device_problem` finds out by running it):

- every stride must be a multiple of 16 bytes, and so must the data pointers: weights are
  stored ``(E, N, K)`` and passed as a transposed view, so both the hidden size and the
  intermediate size must fill whole 16-byte rows (4 fp32 or 8 bf16 elements).
  :func:`layout_problem` says when a shape breaks that rule; the caller then runs the
  reference instead, so numbers are never wrong, only slower;
- its backward rejects a gradient with a zero stride (``y.sum().backward()`` hands one in),
  so the output passes through :class:`DenseGrad`, which materialises such a gradient;
- it cannot take zero rows at all; :func:`grouped_linear` handles ``S == 0`` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

_ALIGN = 16  # bytes


def grouped_mm_op() -> Callable[..., torch.Tensor] | None:
    """The grouped matmul op of this torch, or None when it has none."""
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _row_major(t: torch.Tensor) -> bool:
    stride, expected = t.stride(), []
    step = 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    return tuple(reversed(expected)) == stride


class DenseGrad(torch.autograd.Function):
    """Identity in the forward; in the backward, hands on the incoming gradient as a dense
    row-major tensor (a copy only when it is not one already: expanded, zero-stride...)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if _row_major(grad) and grad.data_ptr() % _ALIGN == 0:
            return grad
        return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device).copy_(grad)


@functools.cache
def layout_problem(hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> str | None:
    """Why torch ``grouped_mm`` cannot take experts of this shape in ``dtype``, or None."""
    item = torch.empty((), dtype=dtype).element_size()
    bad = [f"{name} {size}" for name, size in (("hidden size", hidden_size), ("intermediate size", intermediate_size))
           if (size * item) % _ALIGN]
    if bad:
        return (f"torch grouped_mm needs rows of a multiple of {_ALIGN} bytes ({_ALIGN // item} {dtype} elements); "
                f"{' and '.join(bad)} is not")
    return None


@functools.cache
def device_problem(device_type: str, dtype: torch.dtype) -> str | None:
    """Why torch ``grouped_mm`` does not work on ``device_type`` in ``dtype`` (forward and
    backward of a tiny case, an expert without rows included, checked against ``mm``), or None.
    Runs once per (device type, dtype) and process."""
    op = grouped_mm_op()
    if op is None:
        return f"torch {torch.__version__} has no grouped_mm"
    try:
        device = torch.device(device_type)
        x = torch.randn(8, 16, device=device).to(dtype).requires_grad_()
        w = torch.randn(3, 16, 16, device=device).to(dtype).requires_grad_()
        offs = torch.tensor([3, 3, 8], dtype=torch.int32, device=device)
        y = op(x, w.transpose(-2, -1), offs=offs)
        y.backward(torch.ones_like(y))
        want = torch.cat([x[:3] @ w[0].T, x[3:] @ w[2].T])
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
        if not torch.allclose(y.float(), want.float(), atol=tol, rtol=tol) or w.grad[1].abs().max() != 0:
            return f"torch grouped_mm gives wrong results on {device_type} in {dtype}"
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
        return f"torch grouped_mm does not run on {device_type} in {dtype}: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major with a 16-byte aligned data pointer (a copy, through autograd, if needed)."""
    if _row_major(t) and t.data_ptr() % _ALIGN == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format) if t.is_contiguous() else t.contiguous()


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``(S, K)`` rows sorted by expert, ``(E, N, K)`` weights, ``(E,)`` int32 group ends ->
    ``(S, N)``: the rows of expert ``e`` times ``weight[e].T``. ``offsets[-1]`` must be ``S``.
    Differentiable in ``x`` and ``weight``. The caller checks :func:`layout_problem` first."""
    if x.shape[0] == 0:  # the op cannot take zero rows; an empty product keeps the graph
        return x @ weight[0].T
    y = grouped_mm_op()(_aligned(x), _aligned(weight).transpose(-2, -1), offs=offsets)
    return DenseGrad.apply(y)
