"""Generate the vision example's data: synthetic images and JSONL records, deterministically (seed 0).

Tasks (``data/`` after ``python examples/vision/make_data.py``):

* ``quadrant``: one 32x32 image, black with faint noise, holding a 10x10 square of a random bright
  colour somewhere inside one of its four quadrants; the answer is the quadrant (1 top left,
  2 top right, 3 bottom left, 4 bottom right). Chance: 25%.
* ``red``: two such images, one square red and one blue; the answer is the image holding the red
  one (1 or 2). Chance: 50%.

Files per task ``T``: ``T_sft.jsonl`` (``query``/``response``), ``T_rl.jsonl`` and ``T_test.jsonl``
(``prompt``/``answer``), every record with ``images`` (paths relative to the file), and the same
three with the images shuffled across records (``T_shuffled_*``: the control, whose answers no
longer follow from the images). Test images are drawn apart from the training ones, and the test
answers are balanced (each equally often), so chance is exactly 1 / the number of answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SIZE = 32
SQUARE = 10
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
PROMPTS = {"quadrant": IMAGE + "where is the square? ", "red": IMAGE + IMAGE + "which is red? "}
COUNTS = {"sft": 400, "rl": 2000, "test": 200}


def _canvas(rng: np.random.Generator) -> np.ndarray:
    return (rng.random((SIZE, SIZE, 3)) * 24).astype(np.uint8)


def _square(img: np.ndarray, quadrant: int, colour, rng: np.random.Generator) -> None:
    half = SIZE // 2
    top = (quadrant - 1) // 2 * half + int(rng.integers(0, half - SQUARE + 1))
    left = (quadrant - 1) % 2 * half + int(rng.integers(0, half - SQUARE + 1))
    img[top:top + SQUARE, left:left + SQUARE] = colour


def _bright(rng: np.random.Generator) -> list[int]:
    c = rng.integers(60, 256, size=3)
    c[int(rng.integers(0, 3))] = 255
    return c.tolist()


def quadrant_record(rng: np.random.Generator, answer: int | None = None) -> tuple[list[np.ndarray], str]:
    img = _canvas(rng)
    q = int(rng.integers(1, 5)) if answer is None else answer
    _square(img, q, _bright(rng), rng)
    return [img], str(q)


def red_record(rng: np.random.Generator, answer: int | None = None) -> tuple[list[np.ndarray], str]:
    which = int(rng.integers(1, 3)) if answer is None else answer
    imgs = []
    for k in (1, 2):
        img = _canvas(rng)
        red = (230 + int(rng.integers(0, 26)), int(rng.integers(0, 40)), int(rng.integers(0, 40)))
        blue = (int(rng.integers(0, 40)), int(rng.integers(0, 40)), 230 + int(rng.integers(0, 26)))
        _square(img, int(rng.integers(1, 5)), red if k == which else blue, rng)
        imgs.append(img)
    return imgs, str(which)


MAKERS = {"quadrant": quadrant_record, "red": red_record}
ANSWERS = {"quadrant": 4, "red": 2}


def write(out: Path, seed: int = 0, counts: dict[str, int] | None = None) -> None:
    """Every task's files under ``out`` (``counts``: records per split, default :data:`COUNTS`)."""
    from PIL import Image

    (out / "images").mkdir(parents=True, exist_ok=True)
    for t, (task, make) in enumerate(MAKERS.items()):
        for s, (split, n) in enumerate({**COUNTS, **(counts or {})}.items()):
            rng = np.random.default_rng([seed, t, s])
            # held-out answers balanced (each answer equally often), so chance is 1 / answers exactly
            balanced = (np.random.default_rng([seed, t, s, 2]).permutation(np.arange(n) % ANSWERS[task]) + 1
                        if split == "test" else None)
            rows, paths = [], []
            for i in range(n):
                imgs, answer = make(rng, None if balanced is None else int(balanced[i]))
                names = []
                for k, img in enumerate(imgs):
                    name = f"images/{task}_{split}_{i:05d}_{k}.png"
                    Image.fromarray(img).save(out / name)
                    names.append(name)
                rows.append((answer, names))
                paths.append(names)
            perm = np.random.default_rng([seed, t, s, 1]).permutation(n)
            for prefix, order in ((task, range(n)), (f"{task}_shuffled", perm)):
                with open(out / f"{prefix}_{split}.jsonl", "w", encoding="utf-8") as f:
                    for i, j in enumerate(order):
                        answer, images = rows[i][0], paths[int(j)]
                        rec = ({"query": PROMPTS[task], "response": answer} if split == "sft"
                               else {"prompt": PROMPTS[task], "answer": answer})
                        f.write(json.dumps({**rec, "images": images}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.out, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
