"""FSDP backend on the GRPO yardstick batch, one process: reference forward and train step.

The batch of bench/grpo_vs_trl.py's rlweave step (16 prompts of 32 tokens x 8 responses of
128, shared-prompt packing, bf16 compute, the whole batch in one micro-batch) through one
FSDP worker (world 1, no Ray), for several sets of backend options side by side. Each set
runs in its own process (compiled kernels and allocator state stay apart), and the sets
take turns ``--repeat`` times, so a noisy neighbour hits all of them; the table shows each
set's best reference forward and train step.

    python bench/grpo_train_step.py                               # cpu.kernels rlweave vs torch, compiled
    python bench/grpo_train_step.py --sets "compile=true;compile=false" --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from turns import emit, label, parse_set, run_turns  # noqa: E402


def measure(opts: dict, model: Path, rounds: int, micro_tokens: int) -> dict:
    """One worker with ``opts``: warm-up, then ``rounds`` timed reference forwards and train steps."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    from rlweave.data.batch import Batch
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.ranks import free_port
    from rlweave_backend_fsdp.worker import FSDPWorker

    rng = random.Random(0)
    seqs, plens = [], []
    for _ in range(16):
        prompt = [rng.randrange(10, 4000) for _ in range(32)]
        for _ in range(8):
            seqs.append(prompt + [rng.randrange(10, 4000) for _ in range(128)])
            plens.append(32)
    batch = Batch.from_sequences(seqs, prompt_lens=plens)

    def loss(outputs, mb):
        return -(mb.token["loss_mask"].float() * outputs.logprobs).sum() / 1e4, {}

    ctx = WorkerContext(device="cpu", master_port=free_port(), model={"path": str(model)}, extra={"optim": {"lr": 1e-6}},
                        options={"mixed_precision": "bf16", "max_tokens_per_micro_batch": micro_tokens, **opts})
    w = FSDPWorker(ctx)
    w.init_model()
    out = {"reference": [], "train": [], "tokens": batch.num_tokens}
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        w.compute_logprobs(batch)
        t1 = time.perf_counter()
        w.train_step(batch, loss)
        if r:  # the first round warms up (and compiles)
            out["reference"].append(t1 - t0)
            out["train"].append(time.perf_counter() - t1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="compile=true,cpu.kernels=rlweave;compile=true,cpu.kernels=torch",
                    help="';'-separated option sets (roles.<role>.options of the fsdp backend; cpu.kernels=... for "
                         "a key of the nested cpu section)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per process, after one warm-up")
    ap.add_argument("--repeat", type=int, default=2, help="turns of every set")
    ap.add_argument("--micro-tokens", type=int, default=20480)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        opts, model = json.loads(a.child)
        emit(measure(opts, Path(model), a.rounds, a.micro_tokens))
        return

    from grpo_vs_trl import build

    model = Path(tempfile.mkdtemp(prefix="rlweave-step-"))
    build(model, "yardstick", 16, 32, seed=0)
    sets = [parse_set(s) for s in a.sets.split(";")]
    runs = run_turns(__file__, sets, str(model), ["--rounds", str(a.rounds), "--micro-tokens", str(a.micro_tokens)],
                     a.repeat, lambda r: f"reference {min(r['reference']):.2f} s, train {min(r['train']):.2f} s")
    print(f"\nGRPO yardstick batch ({runs[0][0]['tokens']} tokens, shared prompts), {os.cpu_count()} threads, best of "
          f"{a.repeat} x {a.rounds} rounds, seconds")
    print(f"{'options':55s} {'reference':>10s} {'train step':>11s}")
    for opts, rs in zip(sets, runs):
        best = {k: min(t for r in rs for t in r[k]) for k in ("reference", "train")}
        print(f"{label(opts):55s} {best['reference']:10.2f} {best['train']:11.2f}")


if __name__ == "__main__":
    main()
