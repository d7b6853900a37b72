"""What a rollout engine's decode step costs by the sequences in it, and what that leaves partial rollout to gain.

A sync GRPO step waits for its longest sample: its generation takes as many decode steps as
that sample's tokens, most of them running a few sequences. Partial rollout cuts every call at
``--budget`` tokens, so a step takes at most that many decode steps, each running more
sequences. Which one is faster depends on how a decode step's time grows with the sequences in
it. This bench measures that on the rollout engine itself (the ``--engine`` plugin's engine, as a
rollout rank builds it with its default options, in this process; on the CPU kept to ``--threads``
cores, one as a rollout role with ``cpu_threads: 1``; ``generate`` as algorithms call it, the
sampled tokens' log-probs included), with the long-tail example's SFT model and prompts:

1. For each batch size B in ``--batches``: a call of B sequences for ``--tokens`` tokens
   (EOS ignored) and a call of one token each; their difference over ``tokens - 1`` is the time
   of one decode step of B sequences (prefill taken out). Median of ``--repeat`` pairs.
2. A least-squares line through them: ``step(B) = a + b * B``, ``a`` the cost of a decode step
   whatever it holds, ``b`` each sequence's share.
3. From the line and the task's response lengths (``examples/longtail/data/rl_train.jsonl``:
   the answer's tokens and EOS, ``--groups`` x ``--samples`` drawn at random ``--draws`` times):
   a sync step's generation (one decode step per token of its longest sample, each costing
   ``a + b * sequences still running``) and the least a partial round can take for the same
   tokens (``--budget`` decode steps, every token in them, no prefill of continued samples);
   then, for each ``--rest`` (seconds of a step that are not generation: old log-probs, the
   updates, the weight sync), the most partial rollout can speed a sync step up.

    python bench/decode_cost.py                       # runs/longtail-sft/hf, the vllm engine
    python bench/decode_cost.py --rest 0.49 --rest 0.33 --markdown
    python bench/decode_cost.py --engine hf --device cuda  # the transformers engine on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT / "examples" / "longtail" / "data" / "rl_train.jsonl"


def task(model: Path, cap: int) -> tuple[list[list[int]], list[int]]:
    """The long-tail task's training records as ``(prompts, lengths)``: each prompt's token ids
    (the chat template's), each answer's length in tokens with EOS, at most ``cap``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    records = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)) for r in records[:512]]
    return prompts, [min(cap, len(tok(r["answer"])["input_ids"]) + 1) for r in records]


def engine(name: str, model: Path, threads: int, device: str):
    """The ``name`` engine plugin's rollout engine (what a rollout rank builds, with its default
    options and a 0.5 GiB KV cache) in this process, initialised. On the CPU this process first
    keeps to ``threads`` cores, as a rank with ``cpu_threads`` does."""
    import torch

    from rlweave.interfaces.worker import WorkerContext
    from rlweave.plugins.manager import get_plugin_manager

    if device == "cpu":
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
        torch.set_num_threads(threads)
    options = {"max_model_len": 512, **({"kv_cache_gib": 0.5} if name == "vllm" else {})}
    cls = get_plugin_manager().get("engine", name, where="--engine").load()
    eng = cls(WorkerContext(role="rollout", device=device, options=options, seed=1,
                            model={"path": str(model), "dtype": "float32"}))
    eng.init_engine()
    return eng


def call_seconds(eng, prompts: list[list[int]], tokens: int) -> float:
    """Seconds one generate call of ``prompts`` takes for exactly ``tokens`` tokens each."""
    from rlweave.interfaces.engine import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=tokens, ignore_eos=True, seed=3)
    t0 = time.perf_counter()
    out = eng.generate(prompts, params)
    seconds = time.perf_counter() - t0
    if any(len(g.token_ids) != tokens for gens in out for g in gens):
        raise RuntimeError(f"a call asked for {tokens} tokens a sequence returned another count")
    return seconds


def step_seconds(eng, prompts: list[list[int]], batch: int, tokens: int, repeat: int) -> float:
    """The median time of one decode step of ``batch`` sequences (prefill taken out)."""
    chosen = prompts[:batch]
    diffs = []
    for _ in range(repeat):
        one = call_seconds(eng, chosen, 1)
        full = call_seconds(eng, chosen, tokens)
        diffs.append((full - one) / (tokens - 1))
    return statistics.median(diffs)


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``(a, b)`` of ``seconds = a + b * batch``."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def generation_seconds(a: float, b: float, lengths: list[int], groups: int, samples: int, budget: int,
                       draws: int) -> tuple[float, float, float]:
    """``(sync, partial, tokens)``: the mean generation seconds of a sync step and the least of a
    partial round, over ``draws`` batches of ``groups`` prompts x ``samples`` drawn from
    ``lengths`` (every sample of a group as long as its record's answer), and their mean tokens."""
    rng = random.Random(0)
    sync, partial, toks = [], [], []
    for _ in range(draws):
        batch = [n for n in rng.sample(lengths, groups) for _ in range(samples)]
        sync.append(sum(a + b * sum(1 for n in batch if n > t) for t in range(max(batch))))
        tokens = sum(batch)
        partial.append(min(budget, max(batch)) * a + b * tokens)
        toks.append(tokens)
    return statistics.fmean(sync), statistics.fmean(partial), statistics.fmean(toks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "runs" / "longtail-sft" / "hf",
                    help="a causal LM vLLM serves (default: the long-tail example's SFT model)")
    ap.add_argument("--batches", default="1,4,16,32,64,128", help="sequences per decode step, comma-separated")
    ap.add_argument("--tokens", type=int, default=48, help="decode steps per timed call")
    ap.add_argument("--repeat", type=int, default=3, help="timed pairs of calls per batch size (median)")
    ap.add_argument("--engine", default="vllm", help="an installed engine plugin (rlweave list-plugins): vllm, hf")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when torch sees one")
    ap.add_argument("--threads", type=int, default=1, help="on the CPU: cores for the engine (a rollout role's "
                    "cpu_threads)")
    ap.add_argument("--groups", type=int, default=16, help="prompts a step (data.batch_size)")
    ap.add_argument("--samples", type=int, default=4, help="samples a prompt (algorithm.n_samples)")
    ap.add_argument("--budget", type=int, default=48, help="partial rollout's tokens a round")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--draws", type=int, default=200, help="random batches the step times are averaged over")
    ap.add_argument("--rest", type=float, action="append", default=[],
                    help="seconds of a step that are not generation (repeatable): the most partial rollout gains then")
    ap.add_argument("--goal", type=float, default=1.3, help="a speed-up of partial rollout over sync: the most "
                    "seconds of a step that are not generation at which partial rollout can still reach it")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not (a.model / "config.json").is_file():
        sys.exit(f"no model at {a.model}: run `rlweave train examples/longtail/sft.yaml` first, or pass --model")
    batches = [int(x) for x in a.batches.split(",") if x.strip()]
    if len(batches) < 2 or a.tokens < 2:
        sys.exit("--batches needs two sizes or more and --tokens at least 2: a line is fitted through them")
    from machine import cpu_name  # the CPU model beside every number

    import torch

    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    prompts, lengths = task(a.model, a.max_new_tokens)
    if max(batches) > len(prompts):
        sys.exit(f"--batches: at most {len(prompts)} sequences (the prompts read from {DATA})")
    eng = engine(a.engine, a.model, a.threads, device)
    try:
        call_seconds(eng, prompts[:max(batches)], a.tokens)  # warm-up
        points = {bsz: step_seconds(eng, prompts, bsz, a.tokens, a.repeat) for bsz in batches}
    finally:
        eng.shutdown()
    ca, cb = fit(points)
    sync, partial, tokens = generation_seconds(ca, cb, lengths, a.groups, a.samples, a.budget, a.draws)
    where = torch.cuda.get_device_name() if device == "cuda" else f"{cpu_name()}; {a.threads} engine thread(s)"
    print(f"{datetime.date.today()}, {where}; the {a.engine} engine; {a.tokens} decode steps a call, median of "
          f"{a.repeat}")
    rows = [(str(bsz), f"{s * 1e3:.2f}", f"{(ca + cb * bsz) * 1e3:.2f}", f"{s / bsz * 1e6:.0f}")
            for bsz, s in points.items()]
    head = ("sequences", "ms a decode step", "fit ms", "us a sequence")
    print(f"{head[0]:>9s} {head[1]:>16s} {head[2]:>7s} {head[3]:>13s}")
    for r in rows:
        print(f"{r[0]:>9s} {r[1]:>16s} {r[2]:>7s} {r[3]:>13s}")
    print(f"fit: a decode step {ca * 1e3:.2f} ms + {cb * 1e6:.1f} us a sequence")
    print(f"task ({a.groups} x {a.samples} a step, {tokens:.0f} tokens on average): sync generation {sync:.3f} s, "
          f"partial round at least {partial:.3f} s (budget {a.budget}); {partial / sync:.2f} of sync")
    bounds = [(r, (sync + r) / (partial + r)) for r in a.rest]
    for r, x in bounds:
        print(f"with {r:.2f} s of a step not generation: partial rollout at most {x:.2f}x sync")
    # (sync + r) / (partial + r) >= goal  <=>  r <= (sync - goal * partial) / (goal - 1)
    most = (sync - a.goal * partial) / (a.goal - 1) if a.goal > 1 else float("inf")
    print(f"partial rollout reaches {a.goal:.2f}x sync only if at most {max(0.0, most):.3f} s of a step are not "
          f"generation" if most >= 0 else f"partial rollout cannot reach {a.goal:.2f}x sync here")
    if a.markdown:
        print("\n| sequences | ms a decode step | fit ms | us a sequence |\n|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {' | '.join(r)} |")


if __name__ == "__main__":
    main()
