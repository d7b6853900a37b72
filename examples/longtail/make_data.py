"""Generate the long-tail counting task of examples/longtail (deterministic, seeded).

A prompt ``"a..b="`` asks to count from ``a`` to ``b`` (0 <= a <= b <= 99); the expected
response is the numbers separated by commas (``"7..10="`` -> ``"7,8,9,10"``; the algorithm
appends EOS). The count ``n = b - a + 1`` follows a clipped power law,
``P(n >= k) = (k / scale) ** -alpha`` for ``scale <= k <= max_count`` (scale 3.5, alpha 1.1, at most
80 numbers), so response lengths are heavy-tailed: the median response is ~16 characters (one
token each), one in a hundred is 200 or longer and ~3% are the longest (~240). See README.md.
Run: ``python make_data.py [--out data] [--seed 0]``.

Files (jsonl, one object a line):
  sft_train.jsonl   {"query", "response"}   SFT examples, drawn from the train prompts, every
                                            count equally likely
  rl_train.jsonl    {"prompt", "answer"}    RL prompts (drawn with replacement from the train prompts)
  test.jsonl        {"prompt", "answer"}    held-out prompts (in no train file), drawn by the same law
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

MAX_NUMBER = 99
MAX_COUNT = 80
ALPHA = 1.1
SCALE = 3.5
#: share of the (a, b) pairs of every count held out for test.jsonl
HELD_OUT = 0.2


def prompt_of(a: int, b: int) -> str:
    return f"{a}..{b}="


def answer_of(a: int, b: int) -> str:
    """The expected response: ``a`` to ``b`` (inclusive) separated by commas."""
    return ",".join(str(k) for k in range(a, b + 1))


def draw_count(rng: random.Random, alpha: float = ALPHA, max_count: int = MAX_COUNT, scale: float = SCALE) -> int:
    """A count ``n >= 1`` with ``P(n >= k) = (k / scale) ** -alpha`` (1 for ``k <= scale``),
    clipped at ``max_count``."""
    u = 1.0 - rng.random()  # in (0, 1]
    return max(1, min(max_count, int(scale * u ** (-1.0 / alpha))))


def split_pairs(rng: random.Random, max_count: int = MAX_COUNT) -> tuple[dict[int, list], dict[int, list]]:
    """Every (a, b) pair, by count, shuffled and split into train and held-out pools
    (``HELD_OUT`` of each count, at least one, held out)."""
    train, test = {}, {}
    for n in range(1, max_count + 1):
        pairs = [(a, a + n - 1) for a in range(MAX_NUMBER - n + 2)]
        rng.shuffle(pairs)
        k = max(1, round(HELD_OUT * len(pairs)))
        test[n], train[n] = pairs[:k], pairs[k:]
    return train, test


def draw(rng: random.Random, pools: dict[int, list], size: int, alpha: float, max_count: int,
         scale: float = SCALE) -> list[tuple[int, int]]:
    """``size`` pairs: a count from the law, then a pair of that count from ``pools``."""
    return [rng.choice(pools[draw_count(rng, alpha, max_count, scale)]) for _ in range(size)]


def draw_even(rng: random.Random, pools: dict[int, list], size: int, max_count: int) -> list[tuple[int, int]]:
    """``size`` pairs with every count from 1 to ``max_count`` equally likely (the SFT set: the
    model learns to count every length, so its answers keep the prompts' lengths)."""
    return [rng.choice(pools[rng.randint(1, max_count)]) for _ in range(size)]


def make(out: Path, seed: int = 0, n_sft: int = 4000, n_rl: int = 4000, n_test: int = 256,
         alpha: float = ALPHA, max_count: int = MAX_COUNT, scale: float = SCALE) -> dict[str, int]:
    """Write the three files into ``out``; returns records per file. Same arguments -> same bytes."""
    if not 1 <= max_count <= MAX_NUMBER + 1:
        raise ValueError(f"max_count must be in 1..{MAX_NUMBER + 1}, got {max_count}")
    rng = random.Random(seed)
    train_pool, test_pool = split_pairs(rng, max_count)
    sft = draw_even(rng, train_pool, n_sft, max_count)
    rl = draw(rng, train_pool, n_rl, alpha, max_count, scale)
    test = draw(rng, test_pool, n_test, alpha, max_count, scale)
    files = {
        "sft_train.jsonl": [{"query": prompt_of(a, b), "response": answer_of(a, b)} for a, b in sft],
        "rl_train.jsonl": [{"prompt": prompt_of(a, b), "answer": answer_of(a, b)} for a, b in rl],
        "test.jsonl": [{"prompt": prompt_of(a, b), "answer": answer_of(a, b)} for a, b in test],
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        with open(out / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return {name: len(rows) for name, rows in files.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-sft", type=int, default=4000, help="SFT examples (every count equally likely)")
    ap.add_argument("--n-rl", type=int, default=4000, help="RL prompts")
    ap.add_argument("--n-test", type=int, default=256, help="held-out prompts")
    ap.add_argument("--alpha", type=float, default=ALPHA, help="tail exponent: P(count >= k) = (k / scale) ** -alpha")
    ap.add_argument("--scale", type=float, default=SCALE, help="counts up to it are certain (the law's start)")
    ap.add_argument("--max-count", type=int, default=MAX_COUNT, help="longest count (numbers in a response)")
    args = ap.parse_args()
    sizes = make(args.out, seed=args.seed, n_sft=args.n_sft, n_rl=args.n_rl, n_test=args.n_test,
                 alpha=args.alpha, max_count=args.max_count, scale=args.scale)
    for name, n in sizes.items():
        print(f"{args.out / name}: {n} records")


if __name__ == "__main__":
    main()
