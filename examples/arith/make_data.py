"""Generate the synthetic arithmetic task of examples/arith (deterministic, seeded).

Prompts are ``"a+b="`` and ``"a-b="`` (a, b in 0..49, a >= b for subtraction, so answers
are integers in 0..98); the expected response is the answer's digits (the algorithm appends
EOS). See README.md for the design. Run: ``python make_data.py [--out data] [--seed 0]``.

Files (jsonl, one object a line):
  sft_train.jsonl   {"query", "response"}              a small subset of the train prompts
  rl_train.jsonl    {"prompt", "answer"}               all train prompts
  test.jsonl        {"prompt", "answer"}               held-out prompts (in no train file)
  pref_train.jsonl  {"prompt", "chosen", "rejected"}   train prompts: correct vs wrong answer
  pref_test.jsonl   {"prompt", "chosen", "rejected"}   held-out prompts
  rank_train.jsonl  {"query", "response": [...], "score": [...]}  train prompts, ranked answers
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

MAX_OPERAND = 49


def all_problems(max_operand: int = MAX_OPERAND) -> list[tuple[str, int]]:
    """Every (prompt, answer) of the task, in a fixed order."""
    out = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            out.append((f"{a}+{b}=", a + b))
            if a >= b:
                out.append((f"{a}-{b}=", a - b))
    return out


def wrong_answer(answer: int, rng: random.Random, near: bool) -> int:
    """A wrong, non-negative answer: near misses (+-1, +-2, +-10, digit swap) or any value."""
    while True:
        if near:
            kind = rng.choice(["pm1", "pm2", "pm10", "swap"])
            if kind == "swap" and answer >= 10 and answer % 10 != answer // 10:
                cand = int(str(answer)[::-1])
            else:
                step = {"pm1": 1, "pm2": 2, "pm10": 10, "swap": 1}[kind]
                cand = answer + rng.choice([-step, step])
        else:
            cand = rng.randint(0, 2 * MAX_OPERAND)
        if cand != answer and cand >= 0:
            return cand


def make(out: Path, seed: int = 0, n_test: int = 300, n_sft: int = 600, sft_noise: float = 0.0,
         n_pref: int = 6000, n_pref_test: int = 300, n_rank: int = 1500) -> dict[str, int]:
    rng = random.Random(seed)
    problems = all_problems()
    rng.shuffle(problems)
    test, train = problems[:n_test], problems[n_test:]
    test_prompts = {p for p, _ in test}
    if test_prompts & {p for p, _ in train}:
        raise RuntimeError("a test prompt is in the train split")

    sft = []
    for p, a in train[:n_sft]:
        resp = wrong_answer(a, rng, near=True) if rng.random() < sft_noise else a
        sft.append({"query": p, "response": str(resp)})

    def pref(pool: list[tuple[str, int]], n: int) -> list[dict]:
        rows = []
        for k in range(n):
            p, a = pool[k % len(pool)]
            rows.append({"prompt": p, "chosen": str(a), "rejected": str(wrong_answer(a, rng, near=k % 2 == 0))})
        return rows

    pref_pool = train[:]
    rng.shuffle(pref_pool)
    rank = []
    for p, a in pref_pool[:n_rank]:
        near = wrong_answer(a, rng, near=True)
        far = wrong_answer(a, rng, near=False)
        while far in (near,):
            far = wrong_answer(a, rng, near=False)
        answers = [(str(a), 1.0), (str(near), 0.5), (str(far), 0.0)]
        rng.shuffle(answers)
        rank.append({"query": p, "response": [r for r, _ in answers], "score": [s for _, s in answers]})

    files = {
        "sft_train.jsonl": sft,
        "rl_train.jsonl": [{"prompt": p, "answer": a} for p, a in train],
        "test.jsonl": [{"prompt": p, "answer": a} for p, a in test],
        "pref_train.jsonl": pref(pref_pool, n_pref),
        "pref_test.jsonl": pref(test, n_pref_test),
        "rank_train.jsonl": rank,
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        with open(out / name, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return {name: len(rows) for name, rows in files.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--n-sft", type=int, default=600, help="SFT examples (a subset of the train prompts)")
    ap.add_argument("--sft-noise", type=float, default=0.0, help="fraction of SFT answers made wrong")
    args = ap.parse_args()
    sizes = make(args.out, seed=args.seed, n_test=args.n_test, n_sft=args.n_sft, sft_noise=args.sft_noise)
    for name, n in sizes.items():
        print(f"{args.out / name}: {n} records")


if __name__ == "__main__":
    main()
