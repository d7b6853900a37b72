"""Training throughput of the megatron and deepspeed backends next to the FSDP backend, same model, same batches.

Runs the real ``train_step`` of each backend on a random Qwen2 model (the presets of
``bench/fsdp_throughput.py``) with sample lengths drawn uniformly from [min_len, max_len]; every
configuration sees the same batches (same seed) and the same optimizer, takes ``--warmup``
untimed steps, then ``--steps`` timed ones. Prints tokens/s (real tokens only: padding is not
counted), the ratio to ``fsdp`` and model FLOP/s as a fraction of the ceiling, with the FLOP count
of ``fsdp_throughput.step_flops`` (padding charged to the layout that wastes it).

Configurations (``--backends``), each in fresh processes (``rlweave.testing.ranks.run_ranks``):

* ``fsdp``: ``FSDPWorker`` on one rank, packed micro-batches (the backend's default).
* ``fsdp-padded`` (optional): the same, right-padded rows (``use_packing: false``): the FSDP
  backend with megatron's layout, to tell the layout's cost from the framework's.
* ``megatron``: ``MegatronWorker`` on one rank, tp=1, packed micro-batches (the backend's default).
* ``megatron-padded`` (optional): the same, right-padded rows (``use_packing: false``), whose budget
  counts padded tokens (rows x longest row); it gets the same budget.
* ``megatron-tp2``: two ranks, tensor-parallel 2 (gloo on CPU). On a 2-core machine both ranks
  share the cores that one rank uses alone (one thread each instead of two), so this compares a
  tensor-parallel split with one rank on the same cores, not two machines' worth of compute.
* ``megatron-pp2``, ``megatron-pp2-seq`` (optional): two ranks, pipeline-parallel 2, with the
  ``1f1b`` and the ``sequential`` pipeline schedule. The ``wait`` column is the share of a step
  each stage spends waiting for its neighbour (mean over the stages): the bubble, measured.
* ``megatron-moe-dp2``, ``megatron-moe-ep2`` (optional): a Qwen3-MoE of the preset's shape (8
  experts of width ffn/2, top-2: the dense preset's active FLOPs) on two data-parallel ranks, each
  replica training half of every batch, with the ``moe_groupgemm`` kernel: every rank holding all
  experts (ep=1) vs expert parallelism (ep=2: each rank 4 experts, tokens exchanged by all-to-all).
* ``deepspeed-z2``, ``deepspeed-z3`` (optional): ``DeepSpeedWorker`` on one rank, ZeRO-2 / ZeRO-3,
  packed micro-batches like ``fsdp``; ``deepspeed-z2-offload`` adds the optimizer offload to host
  memory, ``deepspeed-z3-offload`` the optimizer and parameter offload. On one rank nothing is
  sharded: the rows measure what each mode costs per step (on CPU an offload moves nothing).

Precision: ``fp32`` everywhere on CPU. ``bf16`` (meant for GPUs) is FSDP's and DeepSpeed's mixed
precision (fp32 master weights and optimizer, bf16 compute) and megatron's ``model.dtype: bfloat16`` (bf16
parameters and compute, fp32 master weights and AdamW state: ``master_weights``).

    python bench/backend_throughput.py                           # CPU yardstick, fsdp, megatron, megatron-tp2
    python bench/backend_throughput.py --steps 3 --tokens-per-step 4096   # quick check
    python bench/backend_throughput.py --backends fsdp,megatron,deepspeed-z2,deepspeed-z3,deepspeed-z2-offload,deepspeed-z3-offload

On one GPU (fsdp and megatron tp=1; MFU against the dense bf16 peak of ``fsdp_throughput.CEILING``,
989 TFLOP/s: H100 SXM's, which the H200 shares):

    python bench/backend_throughput.py --device cuda --precision bf16 --backends fsdp,megatron \\
        --preset qwen2.5-0.5b --tokens-per-step 65536 --micro-tokens 16384 --max-len 1024
    python bench/backend_throughput.py --device cuda --precision bf16 --backends fsdp,megatron \\
        --preset qwen2.5-1.5b --tokens-per-step 65536 --micro-tokens 16384 --max-len 1024

(``megatron-tp2`` with ``--device cuda`` needs two GPUs.) ``--rounds N`` runs every configuration N
times, the configurations taking turns (order reversed every other round), and takes medians over
all timed steps: on a machine shared with other jobs this spreads their load over every row. On CPU
the processes start with the allocator settings rlweave's CPU ranks use (``turns.as_rank_process``),
and the ceiling is the best of a measurement before and one after the runs. ``--out PATH`` writes the printed table
to PATH and the rows as JSON to PATH with the suffix ``.json``; existing files need ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: fsdp_throughput, cpu_matmul, turns

from fsdp_throughput import PRESETS, ceiling, make_batch, matmul_params, nll, step_flops  # noqa: E402

#: name -> (backend, ranks, parallel sizes)
CONFIGS = {
    "fsdp": ("fsdp", 1, {}),
    "fsdp-padded": ("fsdp", 1, {}),
    "megatron": ("megatron", 1, {}),
    "megatron-padded": ("megatron", 1, {}),
    "megatron-tp2": ("megatron", 2, {"tp": 2}),
    "megatron-pp2": ("megatron", 2, {"pp": 2}),
    "megatron-pp2-seq": ("megatron", 2, {"pp": 2}),
    "megatron-moe-dp2": ("megatron", 2, {"dp": 2}),
    "megatron-moe-ep2": ("megatron", 2, {"dp": 2, "ep": 2}),
    "deepspeed-z2": ("deepspeed", 1, {}),
    "deepspeed-z3": ("deepspeed", 1, {}),
    "deepspeed-z2-offload": ("deepspeed", 1, {}),
    "deepspeed-z3-offload": ("deepspeed", 1, {}),
}
#: options of the megatron configurations beyond the micro-batch budget
MEGATRON = {"megatron-pp2-seq": {"pipeline_schedule": "sequential"}, "megatron-padded": {"use_packing": False}}
#: options of the deepspeed configurations (ZeRO stage; offload of the optimizer, and at stage 3 the parameters)
DEEPSPEED = {
    "deepspeed-z2": {"zero_stage": 2},
    "deepspeed-z3": {"zero_stage": 3},
    "deepspeed-z2-offload": {"zero_stage": 2, "offload_optimizer": "cpu"},
    "deepspeed-z3-offload": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
}
#: the MoE configurations (their model: :func:`moe_dir`)
MOE = ("megatron-moe-dp2", "megatron-moe-ep2")
MOE_EXPERTS, MOE_TOP_K = 8, 2
OPTIM = {"lr": 1e-4}


def moe_dir(model_dir: str) -> str:
    """Where the MoE configurations' model of the preset's shape lives, beside the dense one."""
    return model_dir.rstrip("/") + "-moe"


def _build(ctx_kw: dict, name: str, model_dir: str, opts: dict):
    """The worker of configuration ``name`` on this rank."""
    backend, _, parallel = CONFIGS[name]
    budget, bf16 = opts["micro_tokens"], opts["precision"] == "bf16"
    from rlweave.testing.scenarios import train_worker

    if backend == "fsdp":
        return train_worker("fsdp", ctx_kw, {"path": model_dir}, OPTIM, mixed_precision="bf16" if bf16 else "none",
                            use_packing=name == "fsdp", max_tokens_per_micro_batch=budget)
    if backend == "deepspeed":
        return train_worker("deepspeed", ctx_kw, {"path": model_dir}, OPTIM, mixed_precision="bf16" if bf16 else "none",
                            max_tokens_per_micro_batch=budget, **DEEPSPEED[name])
    if name in MOE:
        model_dir = moe_dir(model_dir)
        ctx_kw = {**ctx_kw, "kernels": {"moe_groupgemm": "rlweave_kernel_moe.kernel:KERNEL"}}
    return train_worker("megatron", ctx_kw, {"path": model_dir, "dtype": "bfloat16" if bf16 else "float32"}, OPTIM,
                        parallel, max_tokens_per_micro_batch=budget, **MEGATRON.get(name, {}))


def _grid_tokens(w, name: str, lens: list[int], budget: int) -> int:
    """Tokens of the rows the forward passes of one step run over (real + padding)."""
    if name == "fsdp" or CONFIGS[name][0] == "deepspeed" or (CONFIGS[name][0] == "megatron"
                                                              and w.cfg.use_packing):  # packed rows
        return sum(lens)
    if CONFIGS[name][0] == "fsdp":
        from rlweave.backend_helpers.hf_model import micro

        groups = micro.plan(lens, budget)
    else:
        from rlweave.data.batch import Batch

        groups = w._plan(Batch.from_sequences([[0] * n for n in lens]), budget)  # the worker's own planner
    return sum(len(g) * max(lens[i] for i in g) for g in groups)


def run_config(ctx_kw: dict, name: str, model_dir: str, opts: dict) -> dict:
    """One configuration on this rank: warm-up, timed steps; rank 0's timings and step results."""
    import random

    import torch

    preset = PRESETS[opts["preset"]]
    cuda = ctx_kw["device"] == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    w = _build(ctx_kw, name, model_dir, opts)
    rng = random.Random(0)
    batches = [make_batch(rng, preset["vocab_size"], opts["tokens_per_step"], opts["min_len"], opts["max_len"])
               for _ in range(opts["warmup"] + opts["steps"])]
    losses, steps = [], []
    piped = CONFIGS[name][0] == "megatron" and w.pp > 1
    dp, dp_rank = (w.dp, w.dp_rank) if CONFIGS[name][0] == "megatron" else (1, 0)
    for i, b in enumerate(batches):
        mine = b.select(list(range(dp_rank, len(b), dp))) if dp > 1 else b  # this replica's half
        sync()
        t0 = time.perf_counter()
        m = w.train_step(mine, nll)
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(m["loss"]))
        if i >= opts["warmup"]:
            lens = b.seqlens.tolist()
            steps.append({"s": dt, "tokens": b.num_tokens, "flops": step_flops(preset, lens),
                          "grid": _grid_tokens(w, name, lens, opts["micro_tokens"]),
                          "micro": int(m.get("num_micro_batches", 0)),
                          "wait_frac": w.stages.wait_s / dt if piped else None})
    if piped:  # every stage's waiting share, averaged, into rank 0's steps
        import torch.distributed as dist

        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, [st["wait_frac"] for st in steps])
        for j, st in enumerate(steps):
            st["wait_frac"] = statistics.mean(fr[j] for fr in every)
    mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    w.shutdown()
    return {"steps": steps, "loss_first": losses[0], "loss_last": losses[-1], "mem_gib": mem}


def summarize(name: str, runs: list[dict]) -> dict:
    """One row from a configuration's runs (one per round): medians over all timed steps."""
    steps = [s for r in runs for s in r["steps"]]
    med = lambda key: statistics.median(key(s) for s in steps)  # noqa: E731
    return {"config": name, "ranks": CONFIGS[name][1], "tok_s": med(lambda s: s["tokens"] / s["s"]),
            "flop_s": med(lambda s: s["flops"] / s["s"]), "s_step_median": med(lambda s: s["s"]),
            "tok_s_mean": sum(s["tokens"] for s in steps) / sum(s["s"] for s in steps),
            "pad_frac": 1 - sum(s["tokens"] for s in steps) / sum(s["grid"] for s in steps),
            "micro_per_step": statistics.mean(s["micro"] for s in steps), "timed_steps": len(steps),
            "wait_frac": (med(lambda s: s["wait_frac"]) if all(s.get("wait_frac") is not None for s in steps)
                          else None),
            "loss_first": runs[0]["loss_first"], "loss_last": runs[0]["loss_last"],
            "mem_gib": max(r["mem_gib"] for r in runs), "runs": runs}


def _finite(x):
    """``x`` with NaN (no GPU memory figure on CPU) as None, for strict JSON."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def _table(rows: list[dict], ceil: float) -> str:
    base = next((r["tok_s"] for r in rows if r["config"] == "fsdp"), None)
    lines = [f"{'config':<18}{'ranks':>6}{'tokens/s':>10}{'vs fsdp':>9}{'s/step':>8}{'FLOP/s':>11}{'MFU':>8}"
             f"{'padding':>9}{'micro':>7}{'wait':>7}{'loss0':>8}{'loss':>8}{'mem GiB':>9}"]
    for r in rows:
        ratio = f"{r['tok_s'] / base:.2f}x" if base else "-"
        wait = f"{100 * r['wait_frac']:.0f}%" if r.get("wait_frac") is not None else "-"
        lines.append(f"{r['config']:<18}{CONFIGS[r['config']][1]:>6}{r['tok_s']:>10.0f}{ratio:>9}"
                     f"{r['s_step_median']:>8.2f}{r['flop_s'] / 1e9:>9.1f} G{100 * r['flop_s'] / ceil:>7.1f}%"
                     f"{100 * r['pad_frac']:>8.1f}%{r['micro_per_step']:>7.1f}{wait:>7}{r['loss_first']:>8.3f}"
                     f"{r['loss_last']:>8.3f}{r['mem_gib']:>9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="fsdp,megatron,megatron-tp2",
                    help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="yardstick")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: fp32 on cpu, bf16 on cuda")
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps per config")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per config")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--micro-tokens", type=int, default=2048,
                    help="max_tokens_per_micro_batch of every backend (padded layouts count padded tokens)")
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every config this many times, taking turns (spreads a noisy neighbour over all)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per config on CPU (split over its ranks)")
    ap.add_argument("--ceiling-tflops", type=float, default=None,
                    help="FLOP/s ceiling for the MFU column, in TFLOP/s, instead of the measured (CPU) or datasheet "
                    "(CUDA) one: on a CPU shared with other jobs a measurement taken in a busy moment is too low")
    ap.add_argument("--model-dir", default=None, help="reuse/build the random model here (default: a temporary one)")
    ap.add_argument("--out", default=None, help="also write the table here and the rows as JSON beside it (.json)")
    ap.add_argument("--force", action="store_true", help="overwrite existing --out files")
    args = ap.parse_args(argv)

    names = list(dict.fromkeys(n.strip() for n in args.backends.split(",") if n.strip()))
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        ap.error(f"--backends: unknown {unknown or 'empty list'}; choose from {', '.join(CONFIGS)}")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1, --warmup >= 0")
    if not 1 <= args.min_len <= args.max_len:
        ap.error(f"--min-len {args.min_len} / --max-len {args.max_len}: need 1 <= min-len <= max-len")
    if args.micro_tokens < args.max_len:
        ap.error(f"--micro-tokens {args.micro_tokens} is below --max-len {args.max_len}: a sample would not fit")
    prec = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    out_txt = out_json = None
    if args.out:
        out_txt = Path(args.out)
        out_json = out_txt.with_suffix(".json") if out_txt.suffix != ".json" else out_txt.with_suffix(".json.json")
        existing = [str(p) for p in (out_txt, out_json) if p.exists()]
        if existing and not args.force:
            ap.error(f"--out: {', '.join(existing)} exists; pass --force to overwrite")
    if args.device == "cpu":
        from turns import as_rank_process

        as_rank_process()  # the allocator settings rlweave's CPU ranks run with (re-executes once)

    import torch

    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.ranks import run_ranks

    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device is visible")
        need = max(CONFIGS[n][1] for n in names)
        if torch.cuda.device_count() < need:
            ap.error(f"--backends {args.backends}: needs {need} GPUs, {torch.cuda.device_count()} visible")
        where = torch.cuda.get_device_name()
    else:
        torch.set_num_threads(args.threads)
        where = f"{args.threads} threads"
    preset = PRESETS[args.preset]
    tmp = None
    if args.model_dir:
        model_dir = args.model_dir
    else:
        tmp = tempfile.TemporaryDirectory(prefix="backend_bench_")
        model_dir = os.path.join(tmp.name, args.preset)
    try:
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            build_tiny_qwen2(model_dir, max_positions=max(4096, args.max_len), init_std=0.02, seed=0, **preset)
        if any(n in MOE for n in names) and not os.path.exists(os.path.join(moe_dir(model_dir), "config.json")):
            from rlweave.testing.tiny_model import build_tiny_qwen3_moe

            build_tiny_qwen3_moe(moe_dir(model_dir), preset["vocab_size"], preset["hidden"], preset["layers"],
                                 preset["heads"], preset["kv_heads"], preset["ffn"] // MOE_TOP_K, 0,
                                 num_experts=MOE_EXPERTS, top_k=MOE_TOP_K, max_positions=max(4096, args.max_len),
                                 init_std=0.02, tie_word_embeddings=preset["tie_word_embeddings"])
        # on CPU: measured here, before and after the ranks run
        ceil = args.ceiling_tflops * 1e12 if args.ceiling_tflops else ceiling(args.device, prec)
        nparam = matmul_params(preset) + (0 if preset["tie_word_embeddings"] else preset["hidden"] * preset["vocab_size"])
        head = (f"# {args.preset}: {nparam / 1e6:.1f}M params, {args.device} {prec}, {where}, lengths "
                f"U[{args.min_len},{args.max_len}], {args.tokens_per_step} tokens/step, micro-batch budget "
                f"{args.micro_tokens}, {args.warmup} warm-up + {args.steps} timed steps x {args.rounds} round(s), "
                f"{date.today()}")
        print(head, flush=True)
        opts = {"preset": args.preset, "precision": prec, "micro_tokens": args.micro_tokens,
                "tokens_per_step": args.tokens_per_step, "min_len": args.min_len, "max_len": args.max_len,
                "steps": args.steps, "warmup": args.warmup}
        runs: dict[str, list[dict]] = {n: [] for n in names}
        total = args.rounds * len(names)
        k = 0
        for rnd in range(args.rounds):  # configs take turns, order reversed every other round
            for name in names if rnd % 2 == 0 else names[::-1]:
                k += 1
                world = CONFIGS[name][1]
                threads = max(1, args.threads // world)
                print(f"  [{k}/{total}] {name}: {world} rank(s)"
                      + (f" x {threads} thread(s)" if args.device == "cpu" else "") + " ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                r = run_ranks(run_config, world, name, model_dir, opts, device=args.device, threads=threads,
                              timeout_s=3600)
                runs[name].append(r)
                rate = statistics.median(st["tokens"] / st["s"] for st in r["steps"])
                print(f"  [{k}/{total}] {name}: {rate:.0f} tok/s ({time.perf_counter() - t0:.0f} s incl. start-up)",
                      file=sys.stderr, flush=True)
        if args.device == "cpu" and args.ceiling_tflops is None:  # best of before and after: the least disturbed
            ceil = max(ceil, ceiling.__wrapped__(args.device, prec))
    finally:
        if tmp is not None:
            tmp.cleanup()
    rows = [summarize(n, runs[n]) for n in names]
    table = _table(rows, ceil)
    how = ("given (--ceiling-tflops)" if args.ceiling_tflops else
           f"2048 x 2048 matmul, {args.threads} threads, best of before/after the runs" if args.device == "cpu"
           else "datasheet dense peak")
    foot = (f"ceiling: {prec} {ceil / 1e12:.3f} TFLOP/s ({how})"
            + "; tokens/s, FLOP/s, s/step: medians over timed steps; tokens/s and MFU count real tokens "
            "only; padding = padded share of the rows run; wait = share of a step the pipeline stages wait "
            "for their neighbours (mean over stages)")
    if any(CONFIGS[n][1] > 1 for n in names) and args.device == "cpu":
        foot += (f"\nmegatron-tp2/pp2/moe: 2 ranks x {max(1, args.threads // 2)} thread(s) on the same cores as the "
                 f"one-rank configs' {args.threads} threads (a parallel split vs one rank, not added compute)")
    print(table + "\n" + foot)
    if out_txt is not None:
        out_txt.parent.mkdir(parents=True, exist_ok=True)
        out_txt.write_text(head + "\n" + table + "\n" + foot + "\n")
        out_json.write_text(json.dumps(_finite({"header": head, "device": args.device, "precision": prec,
                                                "ceiling_flop_s": ceil, "args": vars(args), "rows": rows}),
                                       indent=2) + "\n")
        print(f"wrote {out_txt} and {out_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
