"""Matmul rates of a decoder's linear layers on this CPU: forward, input gradient, weight gradient.

For each linear of a Llama/Qwen2-style layer at ``--tokens`` tokens (default: one 8k-token
micro-batch of the grpo_vs_trl yardstick), times the three products a training step runs,

* forward ``x @ W.t()``, input gradient ``g @ W``, weight gradient ``g.t() @ x``,

plus the weight gradient with both operands transposed to contiguous memory first (copy
included, and without it) and with only the narrower operand transposed first, copy included
(what the FSDP backend's ``cpu.kernels`` does for the MLP and LM head), and prints TFLOP/s
next to the square 2048 x 2048 ceiling of the same dtype. Runs with the allocator settings
rlweave uses on CPU (re-executes itself with ``GLIBC_TUNABLES`` unless set), or fresh outputs
would page-fault:

    .venv/bin/python bench/cpu_matmul.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from turns import as_rank_process  # bench/ is this script's directory, first on sys.path


def seconds(fn, reps: int) -> float:
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def square_ceiling(dtype: torch.dtype, reps: int = 5) -> float:
    """FLOP/s of the best of ``reps`` 2048 x 2048 matmuls in ``dtype`` (this process's threads)."""
    sq = torch.randn(2048, 2048, dtype=dtype)
    return 2 * 2048**3 / seconds(lambda: sq @ sq, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8448)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--kv-dim", type=int, default=128, help="key/value projection width (kv heads x head dim)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    as_rank_process()
    torch.set_num_threads(a.threads)
    dt = getattr(torch, a.dtype)
    ceiling = square_ceiling(dt, a.reps) / 1e12
    print(f"{a.dtype}, {a.threads} threads, {a.tokens} tokens; square 2048 ceiling {ceiling:.2f} TFLOP/s\n")
    shapes = [("q/o proj", a.hidden, a.hidden), ("k/v proj", a.hidden, a.kv_dim), ("gate/up", a.hidden, a.ffn),
              ("down", a.ffn, a.hidden), ("lm_head", a.hidden, a.vocab)]
    print(f"{'linear':10s} {'in':>5s} {'out':>5s}   {'fwd':>6s} {'dX':>6s} {'dW':>6s} {'dW contig':>9s} "
          f"{'dW pre-T':>8s} {'dW narrow-T':>11s}   (TFLOP/s)")
    for name, i, o in shapes:
        x, w, g = torch.randn(a.tokens, i, dtype=dt), torch.randn(o, i, dtype=dt), torch.randn(a.tokens, o, dtype=dt)
        gt, xt = g.t().contiguous(), x.t().contiguous()
        flop = 2 * a.tokens * i * o
        rates = [flop / seconds(f, a.reps) / 1e12 for f in (
            lambda: x @ w.t(), lambda: g @ w, lambda: g.t() @ x,
            lambda: g.t().contiguous() @ x.t().contiguous().t(), lambda: gt @ xt.t(),
            (lambda: (x.t().contiguous() @ g).t()) if i <= o else (lambda: g.t().contiguous() @ x))]
        print(f"{name:10s} {i:5d} {o:5d}   " + " ".join(f"{r:6.2f}" for r in rates[:3])
              + f" {rates[3]:9.2f} {rates[4]:8.2f} {rates[5]:11.2f}")


if __name__ == "__main__":
    main()
