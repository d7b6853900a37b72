"""Write the tools example's data: multiplications of a 3-digit by a 2-digit number, which the
tiny model cannot do in its head, with a calculator tool it can learn to call.

* ``sft_train.jsonl``: tool-use demonstrations as chat ``messages``: the question, the model's
  call ``<tool_call>{"name":"calculator","arguments":{"expression":"a*b"}}</tool_call>``, the
  tool's answer, the model's final answer.
* ``rl_train.jsonl``: ``{"prompt": "a*b=", "answer": a*b}`` for GRPO (disjoint from the demos).
* ``test.jsonl``: held-out questions (disjoint from both).

Run: ``python examples/tools/make_data.py`` (writes ``examples/tools/data/``; same seed, same files).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def tool_call(a: int, b: int) -> str:
    args = {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}
    return "<tool_call>" + json.dumps(args, separators=(",", ":")) + "</tool_call>"


def demo(a: int, b: int) -> dict:
    return {"messages": [{"role": "user", "content": f"{a}*{b}="},
                         {"role": "assistant", "content": tool_call(a, b)},
                         {"role": "tool", "content": str(a * b)},
                         {"role": "assistant", "content": str(a * b)}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "data")
    ap.add_argument("--demos", type=int, default=200)
    ap.add_argument("--rl", type=int, default=2000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(100, 1000) for b in range(10, 100)]
    rng.shuffle(pairs)
    demos = pairs[: args.demos]
    rl = pairs[args.demos: args.demos + args.rl]
    test = pairs[args.demos + args.rl: args.demos + args.rl + args.test]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {"sft_train.jsonl": [demo(a, b) for a, b in demos],
            "rl_train.jsonl": [{"prompt": f"{a}*{b}=", "answer": a * b} for a, b in rl],
            "test.jsonl": [{"prompt": f"{a}*{b}=", "answer": a * b} for a, b in test]}
    for name, items in rows.items():
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in items))
        print(f"wrote {args.out / name} ({len(items)} rows)")


if __name__ == "__main__":
    main()
