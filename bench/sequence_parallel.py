"""Ulysses sequence parallelism in the FSDP backend: one long sample, sp=1 vs sp=2, side by side.

Runs the real ``FSDPWorker.train_step`` (forward, backward, optimizer step) on one sample of
``--tokens`` tokens, on one rank (``sp=1``) and on two ranks of one sequence-parallel group
(``sp=2``), each rank one device (CPU: one process with ``--threads`` threads). Prints per
config the median step time, tokens/s, tokens/s per device, the activation memory of a rank
(the distinct non-parameter tensors autograd keeps for backward, counted by saved-tensor
hooks: independent of the allocator), and the peak memory a rank adds during the timed steps
(CUDA: allocated bytes; CPU: resident set, so it also holds gradients, communication buffers
and allocator slack), with ratios to sp=1.

    python bench/sequence_parallel.py                      # CPU: yardstick model, 8k tokens
    python bench/sequence_parallel.py --tokens 2048 --steps 1 --preset small   # quick check
    python bench/sequence_parallel.py --device cuda --preset qwen2.5-0.5b --tokens 32768
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_throughput import PRESETS  # noqa: E402

PRESETS = dict(PRESETS, small=dict(vocab_size=1024, hidden=256, layers=4, heads=8, kv_heads=2, ffn=1024,
                                   tie_word_embeddings=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="yardstick", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per config (after one short warm-up step)")
    ap.add_argument("--sp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per rank (one rank = one device)")
    ap.add_argument("--activation-checkpointing", action="store_true")
    args = ap.parse_args()

    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_backend_fsdp.testing import run_ranks
    from rlweave_backend_fsdp.testing_sp import bench_case

    p = PRESETS[args.preset]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_qwen2(os.path.join(tmp, "model"), vocab_size=p["vocab_size"], hidden=p["hidden"],
                                     layers=p["layers"], heads=p["heads"], kv_heads=p["kv_heads"], ffn=p["ffn"],
                                     max_positions=max(2048, args.tokens), tie_word_embeddings=p["tie_word_embeddings"]))
        for sp in args.sp:
            r = run_ranks(bench_case, sp, sp, model, args.tokens, args.steps, args.activation_checkpointing,
                          device=args.device, threads=args.threads, timeout_s=3600)
            rows.append((sp, r))
            print(f"sp={sp}: {r['step_s']:.2f} s/step, activations {r['saved_mib']:.0f} MiB, peak +{r['peak_mib']:.0f} "
                  "MiB per rank", file=sys.stderr)
    base_tps = args.tokens / rows[0][1]["step_s"]
    base_peak = rows[0][1]["peak_mib"]
    print(f"\n{args.preset}, one sample of {args.tokens} tokens, {args.device}"
          f"{f', {args.threads} thread(s) per rank' if args.device == 'cpu' else ''}"
          f"{', activation checkpointing' if args.activation_checkpointing else ''}\n")
    base_saved = rows[0][1]["saved_mib"]
    print("| sp | s/step | tokens/s | tokens/s per device | vs sp=1 | activations MiB per rank | vs sp=1 "
          "| peak MiB per rank | vs sp=1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sp, r in rows:
        tps = args.tokens / r["step_s"]
        print(f"| {sp} | {r['step_s']:.2f} | {tps:.0f} | {tps / sp:.0f} | {tps / sp / base_tps:.2f}x "
              f"| {r['saved_mib']:.0f} | {r['saved_mib'] / base_saved:.2f}x "
              f"| {r['peak_mib']:.0f} | {r['peak_mib'] / base_peak:.2f}x |")


if __name__ == "__main__":
    main()
