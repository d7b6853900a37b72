"""Generate the word-problem task of examples/real (deterministic, seeded).

Each problem is a one-step addition or subtraction word problem with small numbers
("Tom has 7 apples. He buys 5 more apples. How many apples does Tom have now?"), asked as a
chat: the problem is the user turn (the model's chat template adds its own default system
message). The reward reads the last number of the reply (``arith_last``).
Run: ``python make_data.py [--out data]``.

Files (jsonl, one object a line): ``train.jsonl`` and ``test.jsonl``, each record
``{"id", "messages": [user], "answer"}``. No problem text of the test split appears
in the train split (checked here and in a test).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Tom", "Anna", "Ben", "Lucy", "Sam", "Mia", "Leo", "Emma", "Max", "Zoe", "Jack", "Lily"]
ITEMS = ["apples", "books", "pencils", "stickers", "marbles", "cookies", "cards", "coins", "shells", "toy cars"]

# (template, operation): {n} name, {x} first number, {y} second number, {i} item
TEMPLATES = [
    ("{n} has {x} {i}. {n} buys {y} more {i}. How many {i} does {n} have now?", "+"),
    ("{n} has {x} {i} and finds {y} more. How many {i} does {n} have in total?", "+"),
    ("There are {x} {i} in a box. {n} puts {y} more {i} in the box. How many {i} are in the box now?", "+"),
    ("{n} has {x} {i}. {n} gives {y} {i} to a friend. How many {i} does {n} have left?", "-"),
    ("{n} had {x} {i} and lost {y} of them. How many {i} does {n} have now?", "-"),
    ("There are {x} {i} on a table. {n} takes {y} {i} away. How many {i} are left on the table?", "-"),
]


def problem(rng: random.Random, max_number: int) -> tuple[str, int]:
    """One word problem and its integer answer (never negative)."""
    template, op = rng.choice(TEMPLATES)
    x, y = rng.randint(2, max_number), rng.randint(1, max_number)
    if op == "-":
        x, y = max(x, y) + 1, min(x, y)  # at least one item left
    text = template.format(n=rng.choice(NAMES), x=x, y=y, i=rng.choice(ITEMS))
    return text, x + y if op == "+" else x - y


def make(out: Path, seed: int = 0, n_train: int = 1000, n_test: int = 200, max_number: int = 10) -> dict[str, int]:
    """Write train.jsonl and test.jsonl under ``out``: distinct problems, shuffled, the first
    ``n_test`` held out. Returns the record count of each file."""
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    while len(seen) < n_train + n_test:
        text, answer = problem(rng, max_number)
        seen.setdefault(text, answer)
    problems = list(seen.items())
    rng.shuffle(problems)
    splits = {"test": problems[:n_test], "train": problems[n_test:]}
    if {t for t, _ in splits["test"]} & {t for t, _ in splits["train"]}:
        raise RuntimeError("a test problem is in the train split")
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with open(out / f"{split}.jsonl", "w") as f:
            for k, (text, answer) in enumerate(rows):
                msgs = [{"role": "user", "content": text}]
                f.write(json.dumps({"id": f"{split}-{k}", "messages": msgs, "answer": answer}) + "\n")
    return {split: len(rows) for split, rows in splits.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--max-number", type=int, default=10, help="largest operand")
    a = ap.parse_args()
    counts = make(a.out, a.seed, a.n_train, a.n_test, a.max_number)
    print(", ".join(f"{a.out / k}.jsonl: {v} records" for k, v in counts.items()))


if __name__ == "__main__":
    main()
