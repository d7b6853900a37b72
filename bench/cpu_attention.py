"""CPU attention at GRPO shapes: how the FSDP backend's packed attention should run on CPU.

Side by side, forward and backward time of one attention call per layer and micro-batch:

* ``causal``: 43 samples of 160 tokens (prompt + response, unshared), causal SDPA;
* ``shared``: the same samples with their 32-token prompt shared: 43 responses of 128
  queries over 160 keys (the prompt, then causal over themselves), masked SDPA;

each with bf16 inputs five ways: CPU SDPA in bf16, SDPA on q, k and v upcast to fp32
(forward and backward), the forward in bf16 with the backward in fp32 (``attention._attend``,
``cpu.attention_backward: fp32``), and the same forward with the compiled bf16 backward
(``cpu.attention_backward: bf16``, the default with ``compile: true`` where bf16 is fast), and
the flash kernel in fp32 forward and backward (``cpu.attention.Modes(forward="fp32")``,
the path on CPUs where bf16 is slow, ``rlweave.devices.cpu``). 8 query heads, 2 KV
heads, head dim 64 (the yardstick model of bench/grpo_vs_trl.py). Prints ms per call and the
ratios to bf16 SDPA. Runs with the allocator settings of rlweave's CPU workers (re-executes
itself with ``GLIBC_TUNABLES`` unless set).

    python bench/cpu_attention.py [--reps 5] [--samples 43]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from turns import as_rank_process  # bench/ is this script's directory, first on sys.path


def run(q_len: int, k_len: int, mask, dtype, mode: str, samples: int, reps: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(samples, 8, q_len, 64, generator=g).to(dtype).requires_grad_()
    k = torch.randn(samples, 2, k_len, 64, generator=g).to(dtype).requires_grad_()
    v = torch.randn(samples, 2, k_len, 64, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(samples, 8, q_len, 64, generator=g).to(dtype)

    def attend():
        if mode in ("mixed", "low", "flash32"):
            from rlweave.backend_helpers.hf_model.attention import _attend
            from rlweave.backend_helpers.hf_model.cpu.attention import Modes

            modes = Modes(forward="fp32" if mode == "flash32" else "input", backward="bf16" if mode == "low" else "fp32")
            return _attend(q, k, v, mask, None, 0.0, True, modes)
        a, b, c = (x.float() for x in (q, k, v)) if mode == "fp32" else (q, k, v)
        o = F.scaled_dot_product_attention(a, b, c, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return o.to(dtype)

    attend().backward(grad)  # warm-up
    fwd = bwd = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        out = attend()
        t1 = time.perf_counter()
        out.backward(grad)
        fwd += t1 - t0
        bwd += time.perf_counter() - t1
    return 1e3 * fwd / reps, 1e3 * bwd / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--samples", type=int, default=43, help="samples per call (a 7,000-token micro-batch)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=128)
    a = ap.parse_args()
    as_rank_process()
    torch.set_num_threads(os.cpu_count() or 1)
    p, r = a.prompt, a.response
    shared_mask = torch.ones(r, p + r, dtype=torch.bool).tril(p)
    cases = [("causal", p + r, p + r, None), ("shared", r, p + r, shared_mask)]
    print(f"{a.samples} samples, 8 q heads / 2 kv heads, head dim 64, prompt {p} + response {r}; "
          f"{torch.get_num_threads()} threads, ms per call")
    print(f"{'layout':8s} {'inputs':18s} {'fwd ms':>8s} {'bwd ms':>8s} {'total':>8s}")
    for name, q_len, k_len, mask in cases:
        rows = {}
        for label, mode in (("bf16", "bf16"), ("bf16 as fp32", "fp32"), ("fwd bf16/bwd fp32", "mixed"),
                            ("bwd bf16 compiled", "low"), ("flash fp32 fwd+bwd", "flash32")):
            f, b = run(q_len, k_len, mask, torch.bfloat16, mode, a.samples, a.reps)
            rows[label] = (f, f + b)
            print(f"{name:8s} {label:18s} {f:8.1f} {b:8.1f} {f + b:8.1f}", flush=True)
        for label in ("bf16 as fp32", "fwd bf16/bwd fp32", "bwd bf16 compiled", "flash fp32 fwd+bwd"):
            print(f"{name:8s} {label}: {rows['bf16'][1] / rows[label][1]:.2f}x as fast as bf16 SDPA (fwd+bwd), "
                  f"forward {rows['bf16'][0] / rows[label][0]:.2f}x")


if __name__ == "__main__":
    main()
