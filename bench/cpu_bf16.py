"""bf16 against fp32 matmuls on this CPU: the probe ``rlweave.devices.cpu`` runs, and the
products behind the FSDP backend's ``auto`` CPU choices.

Prints the probe's ratio (``--probes`` fresh measurements), then for a linear layer of
``--tokens`` tokens and ``--hidden`` -> ``--ffn`` features, per product, the best time in fp32
and in bf16 and their ratio: forward ``x @ W.t()``, input gradient ``g @ W``, weight gradient
``g.t() @ x``, and the weight gradient as ``cpu.kernels: rlweave`` computes it (the narrower
operand transposed into a contiguous copy first, copy included).

    python bench/cpu_bf16.py [--threads 2] [--tokens 512] [--hidden 512] [--ffn 2048]
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def best(fn, reps: int) -> float:
    fn()
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def products(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> dict:
    """The matmuls of a linear layer ``x @ w.t()`` in training, by name."""
    return {
        "forward x @ W.t()": lambda: torch.nn.functional.linear(x, w),
        "input gradient g @ W": lambda: g @ w,
        "weight gradient g.t() @ x": lambda: g.t() @ x,
        "weight gradient, cpu.kernels layout": lambda: (x.t().contiguous() @ g).t().contiguous(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from rlweave.devices.cpu import measure

    probes = []
    for _ in range(a.probes):
        t0 = time.perf_counter()
        s = measure()
        probes.append((s.ratio, time.perf_counter() - t0))
    print(f"probe: {s.describe()}")
    print("probe ratios: " + ", ".join(f"{r:.1f}" for r, _ in probes) +
          f" (each {min(t for _, t in probes):.2f}-{max(t for _, t in probes):.2f} s)")
    torch.set_num_threads(a.threads)
    t, h, f = a.tokens, a.hidden, a.ffn
    print(f"linear {h} -> {f} at {t} tokens, {a.threads} threads, best of {a.reps}, ms")
    print(f"{'product':34s} {'fp32':>9s} {'bf16':>9s} {'bf16/fp32':>10s}")
    rows: dict[str, list[float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        g0 = torch.Generator().manual_seed(0)
        x, w, g = (torch.randn(*shape, generator=g0).to(dtype) for shape in ((t, h), (f, h), (t, f)))
        for name, fn in products(x, w, g).items():
            rows.setdefault(name, []).append(best(fn, a.reps))
    for name, (fp32, bf16) in rows.items():
        print(f"{name:34s} {fp32 * 1e3:9.1f} {bf16 * 1e3:9.1f} {bf16 / fp32:10.1f}")


if __name__ == "__main__":
    main()
