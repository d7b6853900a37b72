"""LoRA vs full fine-tuning on the FSDP backend: memory, step time and what a weight sync ships.

Two rows on the same random Qwen2 model (``bench/fsdp_throughput.py``'s presets, the CPU
yardstick by default; 1 rank, fp32, FSDP2 over gloo on CPU or NCCL on CUDA), each in a fresh
subprocess so that memory peaks do not mix:

* ``full``: every parameter trainable, all of them in AdamW.
* ``lora r=R all-linear``: ``WorkerContext(lora={r, alpha, target_modules: all-linear})``; only
  the adapters are trainable and in AdamW.

Columns:

* trainable parameters; optimizer-state bytes: the AdamW state tensors after the first step
  (this rank's shard);
* peak memory: the subprocess's RSS high-water mark (``ru_maxrss``; it includes torch and the
  process group), on CUDA also ``torch.cuda.max_memory_allocated``;
* s/step: median of ``--steps`` ``train_step`` calls after ``--warmup`` untimed ones, the same
  batches in both rows (``--tokens-per-step`` real tokens, lengths uniform in [min, max]);
* merged sync: seconds to stream the full weights once through ``named_weights()`` (with LoRA,
  each adapted weight is merged, ``W + alpha/r * B @ A``), and the bytes streamed: the training
  side of a full-weight sync;
* adapter save: seconds of ``save_adapter()`` into a temp dir and the dir's size: the payload an
  adapter sync would ship (rlweave has no vLLM adapter-sync mode yet).

Sync and save times are medians of ``--repeats`` calls.

    python bench/lora.py                                   # CPU yardstick, r=16, alpha 32
    python bench/lora.py --steps 3 --tokens-per-step 4096  # quick check
    python bench/lora.py --device cuda --preset qwen2.5-0.5b --tokens-per-step 65536 --micro-tokens 16384
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsdp_throughput import PRESETS, make_batch, nll  # bench/ is this script's directory, first on sys.path
from machine import cpu_name


def timed(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def local_bytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def measure(args) -> dict:
    """One row, in this process (the subprocess the parent started)."""
    import random

    import torch
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.ranks import free_port
    from rlweave_backend_fsdp import lora
    from rlweave_backend_fsdp.worker import FSDPWorker

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    adapters = {"r": args.rank, "alpha": args.alpha, "target_modules": "all-linear"} if args.row == "lora" else None
    ctx = WorkerContext(device=args.device, master_port=free_port(), model={"path": args.model_dir}, lora=adapters,
                        options={"mixed_precision": "none", "max_tokens_per_micro_batch": args.micro_tokens},
                        extra={"optim": {"lr": 1e-4}})
    w = FSDPWorker(ctx)
    w.init_model()
    rng = random.Random(0)
    batches = [make_batch(rng, PRESETS[args.preset]["vocab_size"], args.tokens_per_step, args.min_len, args.max_len)
               for _ in range(args.warmup + args.steps)]
    steps = []
    for i, b in enumerate(batches):
        sync()
        t0 = time.perf_counter()
        w.train_step(b, nll)
        sync()
        steps.append(time.perf_counter() - t0)
        if i == 0:
            optim_bytes = sum(local_bytes(v) for st in w.optimizer.state.values() for v in st.values()
                              if torch.is_tensor(v))
    streamed = []

    def stream():
        streamed[:] = [sum(t.numel() * t.element_size() for _, t in w.named_weights())]

    sync_s = timed(stream, args.repeats)
    save_s = adapter_bytes = None
    if args.row == "lora":
        with tempfile.TemporaryDirectory() as tmp:
            dirs = iter(os.path.join(tmp, str(i)) for i in range(args.repeats))
            save_s = timed(lambda: w.save_adapter(next(dirs)), args.repeats)
            adapter_bytes = sum(f.stat().st_size for f in Path(tmp, "0").iterdir())
    return {"trainable": sum(p.numel() for p in lora.trainable(w.model)), "optim_bytes": optim_bytes,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
            "s_step": statistics.median(steps[args.warmup:]), "sync_s": sync_s, "sync_bytes": streamed[0],
            "save_s": save_s, "adapter_bytes": adapter_bytes}


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="yardstick")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--steps", type=int, default=5, help="timed train steps per row (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed train steps per row")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--micro-tokens", type=int, default=2048, help="max_tokens_per_micro_batch")
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16, help="LoRA r")
    ap.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha")
    ap.add_argument("--repeats", type=int, default=3, help="named_weights / save_adapter calls (median)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--model-dir", default=None, help="reuse/build the random model here")
    ap.add_argument("--row", choices=["full", "lora"], help=argparse.SUPPRESS)  # internal: one row, JSON out
    args = ap.parse_args(argv)
    if args.row:
        print(json.dumps(measure(args)))
        return 0

    from rlweave.testing.tiny_model import build_tiny_qwen2

    preset = PRESETS[args.preset]
    args.model_dir = args.model_dir or os.path.join(tempfile.mkdtemp(prefix="lora_bench_"), args.preset)
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        build_tiny_qwen2(args.model_dir, max_positions=max(4096, args.max_len), init_std=0.02, seed=0, **preset)
    print(f"# LoRA vs full, {dt.date.today()}, {cpu_name()}; {args.preset}, fp32, device {args.device}, 1 rank, "
          f"{args.tokens_per_step} tokens/step, lengths U[{args.min_len},{args.max_len}], micro-batch budget "
          f"{args.micro_tokens}, median of {args.steps} steps after {args.warmup} warmup, "
          f"sync/save median of {args.repeats}" + (f", {args.threads} threads" if args.device == "cpu" else ""),
          flush=True)
    forward = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v is not None and k != "row"]
    rows = {}
    for row in ("full", "lora"):
        cmd = [sys.executable, __file__, *forward, f"--row={row}"]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
        rows[row] = json.loads(out.strip().splitlines()[-1])
        print(f"  done {row}: {rows[row]['s_step']:.2f} s/step", file=sys.stderr, flush=True)
    names = {"full": "full", "lora": f"lora r={args.rank} all-linear"}
    cuda = args.device == "cuda"
    print(f"| row | trainable params | optimizer state MiB | peak RSS MiB |{' peak CUDA MiB |' if cuda else ''} "
          "s/step | named_weights s (MiB) | save_adapter s (adapter MiB) |")
    print("|---|---|---|---|" + ("---|" if cuda else "") + "---|---|---|")
    for row, r in rows.items():
        save = "-" if r["save_s"] is None else f"{r['save_s']:.3f} ({r['adapter_bytes'] / 2**20:.2f})"
        print(f"| {names[row]} | {r['trainable']:,} | {mib(r['optim_bytes'])} | {r['rss_mib']:.0f} |"
              + (f" {r['cuda_mib']:.0f} |" if cuda else "")
              + f" {r['s_step']:.3f} | {r['sync_s']:.3f} ({mib(r['sync_bytes'])}) | {save} |")
    f, lo = rows["full"], rows["lora"]
    print(f"lora/full: s/step {lo['s_step'] / f['s_step']:.2f}x, peak RSS {lo['rss_mib'] / f['rss_mib']:.2f}x"
          + (f", peak CUDA {lo['cuda_mib'] / f['cuda_mib']:.2f}x" if cuda else "")
          + f", optimizer state {lo['optim_bytes'] / f['optim_bytes']:.4f}x, trainable {lo['trainable'] / f['trainable']:.4f}x"
          + f", named_weights {lo['sync_s'] / f['sync_s']:.2f}x; adapter bytes / merged bytes "
          f"{lo['adapter_bytes'] / lo['sync_bytes']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
