"""How much a one-thread vLLM engine slows while a one-thread trainer runs on another core.

What the overlapping run modes do on a CPU machine with one core per role, without rlweave or
Ray in the way: one process generates with ``vllm.LLM`` (the engine core in process, one
intra-op thread, the long-tail task's prompts: 16 x 4 samples of at most 256 tokens, temperature
1, a fixed seed, so every call produces the same tokens), call after call; a second process
trains a small MLP with AdamW on one thread (``--mlp-width``). A control row does the same with a
compute-only load whose data fits in a core's L2 (256 x 256 matmuls).
The load starts once and is stopped (SIGSTOP) and resumed (SIGCONT) between calls, so calls
alone and calls beside it take turns. Columns: seconds a generate call takes with the other core
idle and beside the load (medians), and the median ratio of each pair with the smallest and largest.

    python bench/core_interference.py                  # runs/longtail-sft/hf, or --model
    python bench/core_interference.py --calls 4 --markdown
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: the loads on the other core: a trainer whose weights and optimizer state pass through the
#: shared cache, and matmuls whose operands stay in the core's own caches
LOADS = {
    "trainer": """
import sys, time, torch
torch.set_num_threads(1)
w = int(sys.argv[1])
m = torch.nn.Sequential(*[torch.nn.Linear(w, 4 * w), torch.nn.GELU(), torch.nn.Linear(4 * w, w)] * 2)
opt = torch.optim.AdamW(m.parameters()); x = torch.randn(w, w)
print("go", flush=True)
while True:
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
""",
    "L2-resident matmuls": """
import sys, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
print("go", flush=True)
while True:
    a @ a
""",
}


def engine(model: Path, prompts: int, samples: int, max_tokens: int):
    """A one-thread vLLM engine in this process and a function that runs one generate call."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(model=str(model), skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=512,
              enable_chunked_prefill=False, max_num_batched_tokens=8192, kv_cache_memory_bytes=512 << 20,
              block_size=32, seed=1)
    tok = AutoTokenizer.from_pretrained(str(model))
    data = ROOT / "examples" / "longtail" / "data" / "rl_train.jsonl"
    records = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    step = max(1, len(records) // prompts)
    ids = [list(tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)) for r in records[::step][:prompts]]
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, seed=3)

    def call() -> int:
        out = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in out for c in o.outputs)

    return call


def timed(call) -> tuple[float, int]:
    """Seconds one call takes, and the tokens it produced."""
    t0 = time.perf_counter()
    tokens = call()
    return time.perf_counter() - t0, tokens


def measure(call, load: str, calls: int, width: int) -> dict[str, float]:
    """``calls`` pairs of generate calls, each pair one call with ``load`` stopped (SIGSTOP)
    and one with it running, in turns, so that drift in the machine's speed hits both alike."""
    proc = subprocess.Popen([sys.executable, "-c", LOADS[load], str(width)], stdout=subprocess.PIPE, text=True)
    alone, busy, tokens = [], [], set()
    try:
        if proc.stdout.readline().strip() != "go":  # the load's set-up (imports) is done
            raise RuntimeError(f"the {load!r} load did not start (exit code {proc.poll()})")
        for _ in range(calls):
            os.kill(proc.pid, signal.SIGSTOP)
            s, t = timed(call)
            alone.append(s)
            tokens.add(t)
            os.kill(proc.pid, signal.SIGCONT)
            s, t = timed(call)
            busy.append(s)
            tokens.add(t)
    finally:
        proc.kill()
        proc.wait()
    if len(tokens) != 1:
        raise RuntimeError("the calls produced different tokens: the comparison would not be like for like")
    ratios = sorted(b / a for a, b in zip(alone, busy))
    return {"alone_s": statistics.median(alone), "loaded_s": statistics.median(busy),
            "ratio": statistics.median(ratios), "ratio_lo": ratios[0], "ratio_hi": ratios[-1], "tokens": tokens.pop()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "runs" / "longtail-sft" / "hf",
                    help="a causal LM vLLM serves (default: the long-tail example's SFT model)")
    ap.add_argument("--calls", type=int, default=8, help="pairs of generate calls per load (alone, beside it)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--mlp-width", type=int, default=512, help="the trainer's MLP: a width x 4*width linear and back, applied twice")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not (a.model / "config.json").is_file():
        sys.exit(f"no model at {a.model}: run `rlweave train examples/longtail/sft.yaml` first, or pass --model")
    from machine import cpu_name  # the CPU model beside every number

    call = engine(a.model, a.prompts, a.samples, a.max_tokens)
    call()  # warm-up
    rows = {load: measure(call, load, a.calls, a.mlp_width) for load in LOADS}
    print(f"{datetime.date.today()}, {cpu_name()}; {a.prompts} prompts x {a.samples} samples, <= {a.max_tokens} "
          f"tokens, one thread per process; {a.calls} pairs of calls a load")
    head = ("load on the other core", "tokens a call", "s a call alone", "s a call beside it", "ratio [min-max]")
    cells = {load: (str(r["tokens"]), f"{r['alone_s']:.2f}", f"{r['loaded_s']:.2f}",
                    f"{r['ratio']:.2f}x [{r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}]") for load, r in rows.items()}
    print(f"{head[0]:24s} {head[1]:>13s} {head[2]:>14s} {head[3]:>18s} {head[4]:>18s}")
    for load, c in cells.items():
        print(f"{load:24s} {c[0]:>13s} {c[1]:>14s} {c[2]:>18s} {c[3]:>18s}")
    if a.markdown:
        print("\n| " + " | ".join(head) + " |\n|---|---:|---:|---:|---:|")
        for load, c in cells.items():
            print(f"| {load} | " + " | ".join(c) + " |")


if __name__ == "__main__":
    main()
