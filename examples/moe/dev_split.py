"""Carve a dev split from the arith RL training prompts, for choosing this example's settings
without looking at the test set.

Writes ``OUT/dev.jsonl`` (``--n`` RL training prompts that SFT never sees, drawn with
``--seed``) and ``OUT/rl_train.jsonl`` (the other RL training prompts). Tuning runs evaluate on
the first and train GRPO on the second, e.g.::

    python examples/moe/dev_split.py --out runs/moe-dev
    rlweave train examples/moe/sft.yaml run.name=moe-sft-dev data.eval=runs/moe-dev/dev.jsonl
    rlweave train examples/moe/grpo.yaml run.name=moe-grpo-dev model.path=runs/moe-sft-dev/hf \\
        data.train=runs/moe-dev/rl_train.jsonl data.eval=runs/moe-dev/dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "arith" / "data"


def split(out: Path, n: int = 300, seed: int = 0, data: Path = DATA) -> tuple[Path, Path]:
    """Write ``dev.jsonl`` and ``rl_train.jsonl`` under ``out``; returns their paths."""
    sft = {json.loads(line)["query"] for line in (data / "sft_train.jsonl").read_text().splitlines() if line}
    rl = [line for line in (data / "rl_train.jsonl").read_text().splitlines() if line]
    candidates = [line for line in rl if json.loads(line)["prompt"] not in sft]
    if n > len(candidates):
        raise ValueError(f"--n {n}: only {len(candidates)} RL training prompts are not SFT prompts")
    dev = set(random.Random(seed).sample(candidates, n))
    out.mkdir(parents=True, exist_ok=True)
    dev_path, train_path = out / "dev.jsonl", out / "rl_train.jsonl"
    dev_path.write_text("".join(line + "\n" for line in rl if line in dev))
    train_path.write_text("".join(line + "\n" for line in rl if line not in dev))
    return dev_path, train_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--n", type=int, default=300, help="dev prompts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dev, train = split(args.out, args.n, args.seed)
    print(f"wrote {dev} and {train}")


if __name__ == "__main__":
    main()
