"""Training throughput of the FSDP backend: packed vs padded, fp32 vs bf16.

Runs the real ``FSDPWorker.train_step`` (one rank, FSDP2 over gloo on CPU or NCCL on CUDA)
on a random Qwen2 model with sample lengths drawn uniformly from [min_len, max_len], and
prints tokens/s (real tokens only) and achieved model FLOP/s as a fraction of the ceiling.

Modes (same samples, same optimizer steps):

* ``packed``: the backend's default: micro-batches by token budget, one packed row each.
* ``padded``: the same token-budget micro-batches as right-padded rows (``use_packing: false``).
  The budget planner sorts samples by length, so rows in a micro-batch have similar lengths:
  this is padding with length grouping, already a strong baseline.
* ``padded-fixed``: the conventional layout (Hugging Face Trainer, TRL): a fixed number of
  samples per micro-batch, in data order, padded to the longest. The count is the packed plan's
  mean samples per micro-batch, so both modes take the same number of micro-batches.

Model FLOPs per step = 3 x forward, forward = 2 x (matmul parameters incl. lm_head) x tokens
+ causal attention 2 x n^2 x (heads x head_dim) per sample and layer. Padding is not counted,
so padded rows are charged for the work they waste.

    python bench/fsdp_throughput.py                       # CPU yardstick, all four configs
    python bench/fsdp_throughput.py --steps 2 --tokens-per-step 4096   # quick check
    python bench/fsdp_throughput.py --preset qwen2.5-0.5b --device cuda --precisions bf16 \
        --modes packed --tokens-per-step 65536 --micro-tokens 16384 --max-len 1024

``--compile`` turns on the backend's ``compile`` option; ``--profile`` profiles one extra step
per config and prints the top ops by device (CPU) time and by host time to stderr.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import random
import sys
import tempfile
import time

PRESETS = {
    # ~32M parameters: the CPU yardstick (also bench/grpo_vs_trl.py's, there untied)
    "yardstick": dict(vocab_size=4096, hidden=512, layers=8, heads=8, kv_heads=2, ffn=2048, tie_word_embeddings=True),
    # Qwen2.5-0.5B shape, random weights
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864,
                         tie_word_embeddings=True),
    # Qwen2.5-1.5B shape, random weights
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960,
                         tie_word_embeddings=True),
}
#: CUDA: the H100 SXM datasheet's dense peaks; CPU ceilings are measured at run time (:func:`ceiling`)
CEILING = {("cuda", "bf16"): 989e12, ("cuda", "fp32"): 67e12}


@functools.lru_cache(maxsize=None)
def ceiling(device: str, prec: str) -> float:
    """FLOP/s the fraction column divides by. On CPU: the best of five 2048 x 2048 matmuls
    in this process with its thread count (``bench/cpu_matmul.py``; machines differ: 0.41
    TFLOP/s bf16 on a 2-core AMD EPYC with AVX-512 (2026-11-22), 2.6 on a 2-core Intel Xeon with AMX
    (2026-11-23))."""
    if device == "cuda":
        return CEILING[(device, prec)]
    import torch

    from cpu_matmul import square_ceiling  # bench/ is this script's directory, first on sys.path

    return square_ceiling(torch.bfloat16 if prec == "bf16" else torch.float32)


def matmul_params(p: dict) -> int:
    h, f, layers, heads, kv = p["hidden"], p["ffn"], p["layers"], p["heads"], p["kv_heads"]
    hd = h // heads
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * f
    return layers * per_layer + h * p["vocab_size"]  # + lm_head (embedding lookup is free)


def step_flops(p: dict, lens: list[int]) -> float:
    attn = sum(2 * n * n * p["hidden"] for n in lens) * p["layers"]
    return 3 * (2 * matmul_params(p) * sum(lens) + attn)


def nll(outputs, mb):
    loss = -(mb.token["token_weight"] * outputs.logprobs).sum()
    return loss, {}


nll.needs_entropy = False


def make_batch(rng: random.Random, vocab: int, tokens: int, lo: int, hi: int):
    from rlweave.data.batch import Batch

    seqs, total = [], 0
    while total < tokens:
        n = rng.randint(lo, hi)
        seqs.append([rng.randrange(2, vocab) for _ in range(n)])
        total += n
    b = Batch.from_sequences(seqs)
    b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
    return b


def fixed_count_plan(batches, budget: int):
    """``micro.plan`` replacement for ``padded-fixed``: consecutive samples, ``k`` per micro-batch,
    ``k`` = the token-budget plan's mean samples per micro-batch over ``batches``."""
    from rlweave.backend_helpers.hf_model import micro

    n_samples = sum(len(b) for b in batches)
    n_micro = sum(len(micro.plan(b.seqlens.tolist(), budget)) for b in batches)
    k = max(1, round(n_samples / n_micro))

    def plan(seqlens, _budget):
        return [list(range(i, min(i + k, len(seqlens)))) for i in range(0, len(seqlens), k)]

    return plan, k


def profile_step(w, batch, device: str, label: str, top: int = 15) -> None:
    """One more (untimed) train step under torch.profiler; prints the ops that took the most
    device time (CPU time on CPU) to stderr."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        w.train_step(batch, nll)
        if device == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    avg = prof.key_averages()
    print(f"# profile {label}, by self time\n" + avg.table(sort_by=key, row_limit=top, max_name_column_width=60)
          + f"\n# profile {label}, by host time including children\n"
          + avg.table(sort_by="cpu_time_total", row_limit=top, max_name_column_width=60), file=sys.stderr, flush=True)


def run_one(args, model_dir, preset, mode, prec, port) -> dict:
    import torch

    from rlweave.interfaces.worker import WorkerContext
    from rlweave.backend_helpers.hf_model import micro
    from rlweave_backend_fsdp.worker import FSDPWorker

    cfg = {"mixed_precision": "bf16" if prec == "bf16" else "none", "use_packing": mode == "packed",
           "max_tokens_per_micro_batch": args.micro_tokens, "activation_checkpointing": args.act_ckpt, "compile": args.compile}
    ctx = WorkerContext(device=args.device, master_port=port, options=cfg, model={"path": model_dir},
                        extra={"optim": {"lr": 1e-4}})
    w = FSDPWorker(ctx)
    w.init_model()
    rng = random.Random(0)
    batches = [make_batch(rng, preset["vocab_size"], args.tokens_per_step, args.min_len, args.max_len)
               for _ in range(args.steps + args.warmup)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    budget_plan, per_micro = micro.plan, None
    if mode == "padded-fixed":
        micro.plan, per_micro = fixed_count_plan(batches, args.micro_tokens)
    try:
        for b in batches[: args.warmup]:
            w.train_step(b, nll)
        sync()
        t0 = time.perf_counter()
        toks, flops = 0, 0.0
        losses = []
        for b in batches[args.warmup :]:
            m = w.train_step(b, nll)
            losses.append(m["loss"])
            toks += b.num_tokens
            flops += step_flops(preset, b.seqlens.tolist())
        sync()
        dt = time.perf_counter() - t0
        if args.profile:
            profile_step(w, batches[-1], args.device, f"{mode}/{prec}")
        grid = 0  # tokens of the rows the forward passes ran over (real + padding)
        for b in batches[args.warmup :]:
            lens = b.seqlens.tolist()
            groups = micro.plan(lens, args.micro_tokens)
            grid += sum(lens) if mode == "packed" else sum(len(g) * max(lens[i] for i in g) for g in groups)
    finally:
        micro.plan = budget_plan
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    del w
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ceil = ceiling(args.device, prec)
    return {"mode": mode, "prec": prec, "tok_s": toks / dt, "pad_frac": 1 - toks / grid, "per_micro": per_micro,
            "flop_s": flops / dt, "frac": flops / dt / ceil,
            "s_step": dt / args.steps, "loss": losses[-1], "mem_gib": peak_mem}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="yardstick")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--modes", default="packed,padded,padded-fixed")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps per config")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per config")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--micro-tokens", type=int, default=2048, help="max_tokens_per_micro_batch")
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--act-ckpt", action="store_true", help="activation checkpointing")
    ap.add_argument("--model-dir", default=None, help="reuse/build the random model here")
    ap.add_argument("--compile", action="store_true", help="the backend's compile option (torch.compile per layer)")
    ap.add_argument("--profile", action="store_true", help="profile one extra step per config (top ops to stderr)")
    args = ap.parse_args(argv)

    import torch

    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.ranks import free_port

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    model_dir = args.model_dir or os.path.join(tempfile.mkdtemp(prefix="fsdp_bench_"), args.preset)
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        build_tiny_qwen2(model_dir, max_positions=max(4096, args.max_len), init_std=0.02, seed=0, **preset)
    nparam = matmul_params(preset) + (0 if preset["tie_word_embeddings"] else preset["hidden"] * preset["vocab_size"])
    print(f"# {args.preset}: {nparam / 1e6:.1f}M params, device {args.device}, lengths U[{args.min_len},{args.max_len}], "
          f"{args.tokens_per_step} tokens/step, micro-batch budget {args.micro_tokens}, {args.steps} timed steps"
          + (f", {args.threads} threads" if args.device == "cpu" else f", {torch.cuda.get_device_name()}"))
    port = free_port()
    rows = []
    for prec in args.precisions.split(","):
        for mode in args.modes.split(","):
            rows.append(run_one(args, model_dir, preset, mode, prec, port))
            r = rows[-1]
            print(f"  done {mode}/{prec}: {r['tok_s']:.0f} tok/s", file=sys.stderr, flush=True)
    print(f"{'mode':<14}{'prec':<6}{'tokens/s':>10}{'s/step':>9}{'FLOP/s':>12}{'of ceiling':>12}{'padding':>9}"
          f"{'loss':>9}{'mem GiB':>9}")
    for r in rows:
        print(f"{r['mode']:<14}{r['prec']:<6}{r['tok_s']:>10.0f}{r['s_step']:>9.2f}{r['flop_s'] / 1e9:>10.1f} G"
              f"{100 * r['frac']:>11.1f}%{100 * r['pad_frac']:>8.1f}%{r['loss']:>9.3f}{r['mem_gib']:>9.1f}")
    print("ceiling: " + ", ".join(f"{prec} {ceiling(args.device, prec) / 1e12:.2f} TFLOP/s"
                                  for prec in args.precisions.split(","))
          + (" (2048 x 2048 matmul, measured in this process)" if args.device == "cpu" else " (datasheet)"))
    fixed = [r["per_micro"] for r in rows if r["per_micro"]]
    if fixed:
        print(f"padded-fixed: {fixed[0]} samples per micro-batch")
    by = {(r["mode"], r["prec"]): r for r in rows}
    for prec in args.precisions.split(","):
        for base in ("padded", "padded-fixed"):
            if ("packed", prec) in by and (base, prec) in by:
                print(f"packed vs {base} ({prec}): {by['packed', prec]['tok_s'] / by[base, prec]['tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
