"""Build the vision example's tiny model: a character-level tokenizer with the Qwen2-VL vision tokens,
and a random Qwen2-VL (text: hidden 128, 4 layers; vision tower: 2 blocks of width 64, 4x4 patches
merged 2x2, so a 32x32 image is 16 tokens), saved with its image processor. No downloads. Run:
``python examples/vision/build_model.py --out examples/vision/artifacts/base``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlweave.testing.tiny_vlm import build_tiny_qwen2_vl, vision_tokenizer

ALPHABET = "0123456789 ?abcdefghijklmnopqrstuvwxyz"


def build(out: str | Path, seed: int = 0) -> Path:
    tok = vision_tokenizer([ALPHABET], max_length=256)
    return build_tiny_qwen2_vl(out, tok, hidden=128, layers=4, heads=4, kv_heads=2, ffn=512, seed=seed,
                               vision_depth=2, vision_dim=64, vision_heads=4, patch_size=4, merge_size=2,
                               min_pixels=32 * 32, max_pixels=32 * 32, max_positions=256, init_std=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"wrote {build(args.out, args.seed)}")


if __name__ == "__main__":
    main()
