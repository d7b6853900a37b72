"""One MoE experts layer, forward + backward: Hugging Face's eager loop vs grouped implementations.

Times the experts computation of one MoE layer as a transformers 5 experts module sees it:
hidden states ``(T, H)``, the top-k expert indices and routing weights in, ``(T, H)`` out, with
the routing inside the timing (sorting tokens by expert, gathering, the weighted sum back) and
the router itself (gate linear, softmax, top-k) outside it: the routing comes once from a random
router (softmax, top-k, renormalised) on the same hidden states. Side by side in one process,
taking turns repeat by repeat (so a noisy neighbour hits all alike), median of the repeats:

* ``hf eager``: transformers' ``Qwen3MoeExperts`` with ``experts_implementation="eager"``
  (the per-expert loop), the baseline;
* ``hf grouped_mm``: the same module with transformers' own ``"grouped_mm"`` implementation
  (when this transformers has it);
* ``ours torch``, ``ours triton`` (CUDA with triton), ``ours reference``: rlweave-kernel-moe's
  ``grouped_experts`` with that implementation.

Each row also gives the largest difference of the output and of the four gradients (hidden
states, routing weights, gate_up, down) to ``ours reference`` on the same input, relative to
the largest entry when that exceeds 1. FLOP/s counts the three matmuls of forward + backward
(6 * T * k * 3 * H * I).

    .venv/bin/python bench/moe_experts.py                   # CPU: hidden 512, 64 experts, top-8, 4096 tokens
    PYTHONPATH=plugins/kernel_moe/src:core/src python bench/moe_experts.py --device cuda --dtype bf16 \\
        --preset qwen3-30b-a3b-layer                       # hidden 2048, 128 experts, top-8, 16k tokens
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

PRESETS = {
    # experts layer shapes: hidden size, moe intermediate size (per expert), experts, top-k, tokens
    "cpu-default": {"hidden": 512, "intermediate": 256, "experts": 64, "top_k": 8, "tokens": 4096},
    "qwen3-30b-a3b-layer": {"hidden": 2048, "intermediate": 768, "experts": 128, "top_k": 8, "tokens": 16384},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_ceiling(device: str, dtype: torch.dtype) -> float:
    """FLOP/s of the best of five 2048 x 2048 matmuls in ``dtype`` on ``device``."""
    a = torch.randn(2048, 2048, device=device, dtype=dtype)
    best = float("inf")
    for i in range(7):
        sync(device)
        t = time.perf_counter()
        a @ a
        sync(device)
        if i >= 2:
            best = min(best, time.perf_counter() - t)
    return 2 * 2048**3 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="shapes (default: cpu-default on CPU, qwen3-30b-a3b-layer on CUDA)")
    ap.add_argument("--tokens", type=int, help="override the preset's token count")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default: 3 on CPU, 10 on CUDA)")
    ap.add_argument("--impls", nargs="+", default=None,
                    help="subset of: hf-eager hf-grouped_mm torch triton reference (default: all that run here)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's default)")
    args = ap.parse_args()
    if args.device == "cpu":
        from turns import as_rank_process  # allocator settings of rlweave's CPU workers

        as_rank_process()
        if args.threads:
            torch.set_num_threads(args.threads)

    import transformers
    from rlweave.testing.helper_modules import import_helper
    from rlweave_kernel_moe import experts
    from rlweave_kernel_moe.kernel import KERNEL
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    problems = import_helper(Path(__file__).resolve().parents[1] / "plugins/kernel_moe/tests/experts_problems.py")
    Problem, forward_backward, max_diff = problems.Problem, problems.forward_backward, problems.max_diff

    preset = args.preset or ("qwen3-30b-a3b-layer" if args.device == "cuda" else "cpu-default")
    shape = dict(PRESETS[preset])
    if args.tokens:
        shape["tokens"] = args.tokens
    dtype = DTYPES[args.dtype or ("bf16" if args.device == "cuda" else "fp32")]
    repeats = args.repeats or (10 if args.device == "cuda" else 3)
    h, i, e, k, t = shape["hidden"], shape["intermediate"], shape["experts"], shape["top_k"], shape["tokens"]

    # one experts module; its parameters are the leaves every implementation differentiates
    torch.manual_seed(args.seed)
    cfg = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=i, num_experts=e, num_experts_per_tok=k,
                         hidden_act="silu")
    module = Qwen3MoeExperts(cfg).to(device=args.device, dtype=dtype)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, h ** -0.5)
        module.down_proj.normal_(0, i ** -0.5)
    hidden = torch.randn(t, h, device=args.device, dtype=dtype).requires_grad_()
    with torch.no_grad():  # the router, outside the timing
        router = torch.randn(e, h, device=args.device, dtype=torch.float32) * h ** -0.5
        probs = (hidden.float() @ router.T).softmax(dim=-1)
        top_w, top_idx = probs.topk(k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    problem = Problem(hidden, top_idx, top_w.to(dtype).requires_grad_(), module.gate_up_proj, module.down_proj)
    counts = torch.bincount(top_idx.flatten(), minlength=e)

    def hf(impl_name):
        def fn(p):
            module.config._experts_implementation = impl_name
            return module(p.hidden, p.top_k_index, p.top_k_weights)
        return fn

    def ours(impl):
        return lambda p: experts.grouped_experts(p.hidden, p.top_k_index, p.top_k_weights, p.gate_up, p.down,
                                                 module.act_fn, impl)

    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    candidates = {"hf-eager": ("hf eager", hf("eager"), None),
                  "hf-grouped_mm": ("hf grouped_mm", hf("grouped_mm"),
                                    None if "grouped_mm" in ALL_EXPERTS_FUNCTIONS else "not in this transformers"),
                  "torch": ("ours torch", ours("torch"), KERNEL.why_not("torch", args.device)),
                  "triton": ("ours triton", ours("triton"), KERNEL.why_not("triton", args.device)),
                  "reference": ("ours reference", ours("reference"), None)}
    wanted = args.impls or list(candidates)
    unknown = [w for w in wanted if w not in candidates]
    if unknown:
        raise SystemExit(f"unknown --impls {unknown}; choose from {', '.join(candidates)}")
    runs = {key: candidates[key] for key in wanted if candidates[key][2] is None}
    skipped = {candidates[key][0]: candidates[key][2] for key in wanted if candidates[key][2] is not None}

    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(t, h, generator=g).to(device=args.device, dtype=dtype)

    def step(fn):
        for leaf in problem.leaves():
            leaf.grad = None
        y = fn(problem)
        y.backward(grad_out)

    times: dict[str, list[float]] = {key: [] for key in runs}
    for key, (_, fn, _) in runs.items():
        for _ in range(args.warmup):
            step(fn)
    for _ in range(repeats):
        for key, (_, fn, _) in runs.items():
            sync(args.device)
            start = time.perf_counter()
            step(fn)
            sync(args.device)
            times[key].append(time.perf_counter() - start)

    want = forward_backward(ours("reference"), problem)
    flops = 6 * t * k * 3 * h * i
    ceiling = matmul_ceiling(args.device, dtype)
    base = statistics.median(times["hf-eager"]) if "hf-eager" in times else None

    print(f"\nMoE experts layer, forward + backward (routing included, router excluded): hidden {h}, "
          f"moe intermediate {i}, {e} experts, top-{k}, {t} tokens, {str(dtype).replace('torch.', '')}, "
          f"{args.device}")
    print(f"machine: {machine(args.device)}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"2048x2048 matmul ceiling {ceiling / 1e9:.0f} GFLOP/s")
    print(f"tokens per expert: min {counts.min().item()}, median {counts.median().item()}, max {counts.max().item()}; "
          f"median of {repeats} repeats after {args.warmup} warm-up\n")
    print("| implementation | ms fwd+bwd | vs hf eager | GFLOP/s | max diff to reference (out / grads) |")
    print("|---|---:|---:|---:|---:|")
    for key, (label, fn, _) in runs.items():
        ms = statistics.median(times[key]) * 1e3
        d = max_diff(forward_backward(fn, problem), want)
        grads = max(v for name, v in d.items() if name != "output")
        speed = f"{base * 1e3 / ms:.2f}x" if base else "-"
        print(f"| {label} | {ms:.1f} | {speed} | {flops / ms / 1e6:.0f} | {d['output']:.1e} / {grads:.1e} |")
    for label, why in skipped.items():
        print(f"| {label} | - | - | - | not run: {why} |")
    if experts.fallbacks():
        print(f"\nfell back to the reference: {experts.fallbacks()}")


if __name__ == "__main__":
    main()
