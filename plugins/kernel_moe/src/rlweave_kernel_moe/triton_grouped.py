"""Grouped GEMM for MoE experts, in Triton (CUDA; imported only when triton and CUDA exist).

The rows of ``X`` (``(S, K)``) are sorted by expert: expert ``e`` owns rows
``[start_e, end_e)`` with ``end_e = offsets[e]``. The expert weights are ``W`` (``(E, N, K)``,
the Hugging Face layout). Three products, all accumulated in fp32:

- forward:  ``Y[r]  = X[r] @ W[e].T``   for every row ``r`` of expert ``e``   (``(S, N)``)
- backward: ``dX[r] = dY[r] @ W[e]``                                        (``(S, K)``)
- backward: ``dW[e] = dY[rows_e].T @ X[rows_e]``                            (``(E, N, K)``)

The first two are the same kernel, :func:`_rows_kernel` (``C[r] = A[r] @ B[e]`` with ``B[e]``
read through strides, so ``W[e].T`` and ``W[e]`` need no copy). It runs over a list of row
tiles of ``BLOCK_M`` rows built from the offsets (:func:`tile_map`): a tile lies inside one
expert's rows, so a tile never mixes two experts; an expert with no rows gets no tile. The
list is built on the device without a host sync, so its length is an upper bound
(``ceil(S / BLOCK_M) + E``) and spare tiles exit at once. The third is
:func:`_weight_grad_kernel`: one program per (expert, N tile, K tile), looping over that
expert's rows; an expert with no rows gets a zero gradient.

fp32 inputs use IEEE fp32 products unless ``torch.backends.cuda.matmul.allow_tf32`` is on
(then TF32, as torch's own matmuls do). Indices are widened to int64 before they multiply a
stride, so large ``S * K`` cannot overflow. Setting ``TRITON_INTERPRET=1`` before triton is
imported runs the same kernels on CPU tensors (slowly), which checks the indexing without a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), used by both kernels (in the weight-gradient
#: kernel BLOCK_M is the reduction block). 16-bit inputs take 128-row tiles when experts average
#: at least 256 rows, where few tiles are partly empty.
_SMALL = {torch.float32: (64, 64, 32, 4, 3), torch.float16: (64, 128, 64, 4, 3), torch.bfloat16: (64, 128, 64, 4, 3)}
_LARGE = {**_SMALL, torch.float16: (128, 128, 64, 8, 3), torch.bfloat16: (128, 128, 64, 8, 3)}


def _config(dtype: torch.dtype, rows: int, experts: int) -> tuple[int, int, int, int, int]:
    return (_LARGE if rows >= 256 * experts else _SMALL)[dtype]


@triton.jit
def _rows_kernel(A, B, C, tile_expert, tile_row, group_end,
                 N, K,
                 stride_am, stride_ak,
                 stride_be, stride_bk, stride_bn,
                 stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PRECISION: tl.constexpr):
    """``C[r, n] = sum_k A[r, k] * B[e, k, n]`` for the ``BLOCK_M`` rows of one tile (all of
    expert ``e``) and one block of ``BLOCK_N`` columns."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_expert + tile)
    if e < 0:  # spare tile: the grid is an upper bound on the number of tiles
        return
    row_start = tl.load(tile_row + tile)
    row_end = tl.load(group_end + e)  # rows at or past it belong to the next expert

    rows = row_start + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < row_end
    col_ok = cols < N

    a_ptrs = A + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak
    b_ptrs = B + e.to(tl.int64) * stride_be + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = C + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _weight_grad_kernel(DY, X, DW, group_start, group_end,
                        N, K,
                        stride_dym, stride_dyn,
                        stride_xm, stride_xk,
                        stride_dwe, stride_dwn, stride_dwk,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    """``DW[e, n, k] = sum_r DY[r, n] * X[r, k]`` over the rows ``r`` of expert ``e``, for one
    ``BLOCK_N x BLOCK_K`` block of ``DW[e]``."""
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    start = tl.load(group_start + e)
    end = tl.load(group_end + e)

    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    ms = tl.arange(0, BLOCK_M)
    n_ok = ns < N
    k_ok = ks < K

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m0 in range(start, end, BLOCK_M):  # no iteration for an expert without rows: zero gradient
        rows = m0 + ms
        row_ok = rows < end
        # dY rows of this block, read transposed: (BLOCK_N, BLOCK_M)
        dyt = tl.load(DY + rows[None, :].to(tl.int64) * stride_dym + ns[:, None] * stride_dyn,
                      mask=n_ok[:, None] & row_ok[None, :], other=0.0)
        x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(dyt, x, acc, input_precision=PRECISION)

    dw_ptrs = DW + e.to(tl.int64) * stride_dwe + ns[:, None] * stride_dwn + ks[None, :] * stride_dwk
    tl.store(dw_ptrs, acc.to(DW.dtype.element_ty), mask=n_ok[:, None] & k_ok[None, :])


def _precision(dtype: torch.dtype) -> str:
    """TF32 products for fp32 inputs only where torch's own matmuls take them (ignored for 16-bit inputs)."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"


def problem(device_type: str, dtype: torch.dtype) -> str | None:
    """Why tensors of ``dtype`` on ``device_type`` cannot go through the Triton kernels, or None."""
    if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"the Triton kernels need CUDA tensors (got {device_type})"
    if dtype not in _SMALL:
        return f"the Triton kernels take fp32, fp16 or bf16 (got {dtype})"
    return None


def tile_map(offsets: torch.Tensor, num_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row tiles of at most ``block_m`` rows, none crossing an expert boundary.

    Returns ``(tile_expert, tile_row)``, int32, of length ``ceil(num_rows / block_m) + E`` (an
    upper bound of the real count, known without a host sync): tile ``t`` covers rows
    ``[tile_row[t], min(tile_row[t] + block_m, offsets[e]))`` of expert ``e = tile_expert[t]``;
    ``tile_expert[t] == -1`` marks a spare tile.
    """
    ends = offsets.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tiles = (counts + block_m - 1) // block_m
    tiles_end = torch.cumsum(tiles, 0)
    num_experts = ends.numel()
    t = torch.arange(triton.cdiv(num_rows, block_m) + num_experts, device=offsets.device)
    expert = torch.searchsorted(tiles_end, t, right=True)  # first expert whose tiles end after t
    valid = expert < num_experts
    e = expert.clamp(max=num_experts - 1)
    row = (ends[e] - counts[e]) + (t - (tiles_end[e] - tiles[e])) * block_m
    return (torch.where(valid, expert, -1).to(torch.int32).contiguous(),
            torch.where(valid, row, 0).to(torch.int32).contiguous())


def rows_times_experts(a: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, transpose: bool) -> torch.Tensor:
    """``a`` ``(S, R)`` sorted by expert -> ``(S, C)``: rows of expert ``e`` times ``weight[e].T``
    (``transpose``; ``R = K``, ``C = N``) or times ``weight[e]`` (``R = N``, ``C = K``)."""
    num_rows = a.shape[0]
    block_m, block_n, block_k, warps, stages = _config(a.dtype, num_rows, weight.shape[0])
    if transpose:  # B[e][k, n] = W[e, n, k]
        red, cols, stride_bk, stride_bn = weight.shape[2], weight.shape[1], weight.stride(2), weight.stride(1)
    else:          # B[e][n, k] = W[e, n, k]
        red, cols, stride_bk, stride_bn = weight.shape[1], weight.shape[2], weight.stride(1), weight.stride(2)
    out = torch.empty(num_rows, cols, dtype=a.dtype, device=a.device)
    tile_expert, tile_row = tile_map(offsets, num_rows, block_m)
    grid = (tile_expert.numel(), triton.cdiv(cols, block_n))
    _rows_kernel[grid](
        a, weight, out, tile_expert, tile_row, offsets,
        cols, red,
        a.stride(0), a.stride(1),
        weight.stride(0), stride_bk, stride_bn,
        out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=_precision(a.dtype),
        num_warps=warps, num_stages=stages,
    )
    return out


def weight_grad(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``(E, N, K)``: ``dW[e] = dy[rows_e].T @ x[rows_e]``, zero for an expert without rows."""
    block_m, block_n, block_k, warps, stages = _config(x.dtype, x.shape[0], num_experts)
    n, k = dy.shape[1], x.shape[1]
    dw = torch.empty(num_experts, n, k, dtype=x.dtype, device=x.device)
    ends = offsets.long()
    starts = (ends - torch.diff(ends, prepend=ends.new_zeros(1))).to(torch.int32)
    grid = (num_experts, triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _weight_grad_kernel[grid](
        dy, x, dw, starts, offsets,
        n, k,
        dy.stride(0), dy.stride(1),
        x.stride(0), x.stride(1),
        dw.stride(0), dw.stride(1), dw.stride(2),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=_precision(x.dtype),
        num_warps=warps, num_stages=stages,
    )
    return dw


class GroupedLinear(torch.autograd.Function):
    """``y = x_e @ W[e].T`` per expert group, differentiable in ``x`` and ``W``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight, offsets)
        return rows_times_experts(x, weight, offsets, transpose=True)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, offsets = ctx.saved_tensors
        # The kernels read through strides, so any incoming gradient (even a zero-stride one) is fine.
        dx = rows_times_experts(dy, weight, offsets, transpose=False) if ctx.needs_input_grad[0] else None
        dw = weight_grad(dy, x, offsets, weight.shape[0]) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`rlweave_kernel_moe.torch_grouped.grouped_linear`, on the Triton kernels."""
    return GroupedLinear.apply(x, weight, offsets)
