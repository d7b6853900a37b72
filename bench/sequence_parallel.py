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

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_throughput import PRESETS  # noqa: E402

PRESETS = dict(PRESETS, small=dict(vocab_size=1024, hidden=256, layers=4, heads=8, kv_heads=2, ffn=1024,
                                   tie_word_embeddings=True))


def _rss_mib() -> tuple[float, float]:
    """``(current, peak since the last reset)`` resident memory of this process in MiB (Linux)."""
    vals = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # "5": reset the peak resident set size
        fh.write("5")


class SavedActivations:
    """Bytes of the distinct non-parameter tensors autograd saves for backward while active
    (a context manager around forwards): the activation memory of a step, independent of the
    allocator. ``peak`` is the largest total seen across the forwards run inside."""

    def __init__(self) -> None:
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):  # parameters are not activations
            st = t.untyped_storage()
            self._seen[st.data_ptr()] = st.nbytes()
            self.peak = max(self.peak, sum(self._seen.values()))
        return t

    def reset(self) -> None:
        """Forget the tensors of the last forward (call between micro-batches' forwards)."""
        self._seen.clear()

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def bench_case(ctx_kw: dict, sp: int, model_dir: str, tokens: int, steps: int,
               activation_checkpointing: bool = False) -> dict:
    """Train steps on one ``tokens``-long sample at ``parallel.sp = sp`` (after one warm-up
    step on a short sample). Returns ``step_s`` (median), ``peak_mib``: the largest rise of
    any rank's memory over its level before the timed steps (CUDA: allocated bytes; CPU: the
    process's resident set), and ``saved_mib``: the largest activation memory of any rank
    (:class:`SavedActivations`, one more step)."""
    import statistics
    import time

    import torch.distributed as dist

    from rlweave.data.batch import Batch
    from rlweave.testing.scenarios import nll_loss, train_worker

    def sample(n: int, seed: int) -> Batch:
        g = torch.Generator().manual_seed(seed)
        b = Batch.from_sequences([torch.randint(2, 1000, (n,), generator=g).tolist()], prompt_lens=[16])
        b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
        return b

    options = {"max_tokens_per_micro_batch": tokens, "activation_checkpointing": activation_checkpointing}
    w = train_worker("fsdp", ctx_kw, {"path": model_dir, "dtype": "float32"}, {"lr": 1e-5},
                     {"sp": sp} if sp > 1 else {}, **options)
    w.train_step(sample(256, 0), nll_loss)
    cuda = w.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        import gc

        gc.collect()
        base = _rss_mib()[0]
        _reset_peak()
    times = []
    batch = sample(tokens, 1)
    for _ in range(steps):
        t0 = time.perf_counter()
        w.train_step(batch, nll_loss)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else _rss_mib()[1]) - base
    with SavedActivations() as saved:  # one more step, counting what the forward keeps for backward
        w.train_step(batch, nll_loss)
    peaks: list = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, (peak, saved.peak / 2**20))
    return {"step_s": statistics.median(times), "peak_mib": max(p for p, _ in peaks),
            "saved_mib": max(s for _, s in peaks)}


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
    from rlweave.testing.ranks import run_ranks

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
