"""Multi-turn rollouts: episodes per second with independent episodes vs lock-step turns, when the
environment's latency varies.

A tiny random Qwen2 (character tokenizer) generates on the HF engine in this process; each episode
takes ``--turns`` model turns of at most ``--new-tokens`` tokens, and after each turn the
environment sleeps a random time drawn uniformly from ``[--lat-min, --lat-max]`` milliseconds (a
tool call) before answering. The same episodes (same seeds, same latencies) run with
``scheduling: independent`` (episodes whose step is done go to the engine together while slower
steps go on) and ``lockstep`` (each engine call waits for every step of the turn), taking turns
``--repeat`` times. ``--in-flight K`` streams the episodes: at most K run at once, the next starting
when one ends (``max_in_flight``). Prints episodes/s (median over repeats), the ratio, and the
engine calls made.

    python bench/multi_turn.py                            # 32 episodes, 3 turns, 0-200 ms
    python bench/multi_turn.py --episodes 128 --in-flight 32
    python bench/multi_turn.py --episodes 64 --lat-max 500 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from rlweave.interfaces.environment import Environment, EnvStep


class Latency(Environment):
    """Answers each model turn after a random sleep (its own seeded stream), until ``turns`` turns."""

    def reset(self, record):
        self.rng = random.Random(record["seed"])
        self.left = self.args["turns"]
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        time.sleep(self.rng.uniform(self.args["lat_min"], self.args["lat_max"]) / 1000)
        self.left -= 1
        if self.left == 0:
            return EnvStep(done=True, reward=1.0)
        return EnvStep(messages=[{"role": "tool", "content": "ok"}], info={"tool_calls": 1})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--lat-min", type=float, default=0.0, help="ms")
    ap.add_argument("--lat-max", type=float, default=200.0, help="ms")
    ap.add_argument("--concurrency", type=int, default=32, help="environment steps at once")
    ap.add_argument("--in-flight", type=int, default=None, help="episodes at once (default: all)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    import torch
    from rlweave.algo_helpers.multi_turn import MultiTurnRollout
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.tiny_tokenizer import char_tokenizer
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="multi_turn_bench_") as tmp:
        model = build_tiny_qwen2(Path(tmp) / "m", tokenizer=char_tokenizer(["0123456789+-=ok "]), seed=0)
        tok = AutoTokenizer.from_pretrained(model)
        engine = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 256},
                                        model={"path": str(model), "dtype": "float32"}, seed=1))
        engine.init_engine()
        calls = {"n": 0}

        def generate(prompts, params):
            calls["n"] += 1
            return engine.generate(prompts, params)

        records = [{"prompt": f"{i}+{i}=", "seed": i} for i in range(args.episodes)]
        env_args = {"turns": args.turns, "lat_min": args.lat_min, "lat_max": args.lat_max}
        # no stop token: every turn is new-tokens long, so both modes do the same engine work
        sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens, seed=3)
        rates: dict[str, list[float]] = {"independent": [], "lockstep": []}
        ncalls: dict[str, int] = {}
        for rep in range(args.repeat):
            for mode in (("independent", "lockstep") if rep % 2 == 0 else ("lockstep", "independent")):
                cfg = MultiTurnConfig.model_validate({"env": {"name": f"{__file__}:Latency"}, "max_turns": args.turns + 1,
                                                      "scheduling": mode, "concurrency": args.concurrency,
                                                      "end_on_length": False, "max_in_flight": args.in_flight})
                rollout = MultiTurnRollout(cfg, Latency, env_args, tok)
                calls["n"] = 0
                t0 = time.perf_counter()
                groups = rollout.episodes(records, 1, sampling, generate)
                dt = time.perf_counter() - t0
                rollout.close()
                done = sum(t.ended_by == "done" for g in groups for t in g)
                if done != args.episodes:
                    ends = sorted({t.ended_by for g in groups for t in g})
                    raise RuntimeError(f"{mode}: {done} of {args.episodes} episodes ended by the environment ({ends})")
                rates[mode].append(args.episodes / dt)
                ncalls[mode] = calls["n"]
                print(f"  [{rep + 1}/{args.repeat}] {mode}: {args.episodes / dt:.2f} episodes/s, {calls['n']} engine "
                      "calls", file=sys.stderr, flush=True)
        engine.shutdown()
    ind, lock = statistics.median(rates["independent"]), statistics.median(rates["lockstep"])
    flight = f", {args.in_flight} in flight" if args.in_flight else ""
    print(f"# {args.episodes} episodes{flight} x {args.turns} turns of {args.new_tokens} tokens, tool latency "
          f"U[{args.lat_min:g}, {args.lat_max:g}] ms, HF engine (tiny Qwen2, CPU), {args.repeat} repeats, {date.today()}")
    print(f"{'scheduling':<13}{'episodes/s':>11}{'ratio':>8}{'engine calls':>14}")
    print(f"{'lockstep':<13}{lock:>11.2f}{1.0:>7.2f}x{ncalls['lockstep']:>14}")
    print(f"{'independent':<13}{ind:>11.2f}{ind / lock:>7.2f}x{ncalls['independent']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
