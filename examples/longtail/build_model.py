"""Build the long-tail example's tiny model: a locally trained character-level tokenizer for the
counting task and a random Qwen2 (~1M parameters, untied embeddings, 512 positions), saved as a
Hugging Face directory (safetensors) that transformers and vLLM load. No downloads.

Run: ``python examples/longtail/build_model.py --out examples/longtail/artifacts/base``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlweave.testing.tiny_model import build_tiny_qwen2
from rlweave.testing.tiny_tokenizer import char_tokenizer, task_texts

HERE = Path(__file__).resolve().parent
ALPHABET = "0123456789.,="


def train_tokenizer(data_dir: Path):
    """A character-level WordLevel tokenizer (17 tokens: 4 specials, digits, ``.``, ``,``, ``=``)
    as a ``PreTrainedTokenizerFast``: pad/bos/eos/unk set, no BOS added, the shared chat template
    (:func:`rlweave.testing.tiny_tokenizer.char_tokenizer`).

    No space in the alphabet: transformers 5 loads this directory's tokenizer as ``Qwen2Tokenizer``
    (from the model type), whose byte-level pre-tokenizer drops a space that is not in the vocabulary
    as ``"\u0120"``; every other printable ASCII character of the task survives it unchanged."""
    return char_tokenizer(task_texts(data_dir, ALPHABET), max_length=512)


def build(out: str | Path, data_dir: str | Path = HERE / "data", seed: int = 0, hidden: int = 128,
          layers: int = 4, heads: int = 4, kv_heads: int = 2, ffn: int = 512, max_positions: int = 512) -> Path:
    """Write tokenizer + random fp32 Qwen2 into ``out``; returns ``out``. Untied embeddings (the
    recorded results were made with them), head size ``hidden / heads``, transformers' own initialisation,
    greedy generation defaults. Same arguments -> same files."""
    return build_tiny_qwen2(out, None, hidden, layers, heads, kv_heads, ffn, seed, max_positions=max_positions,
                            init_std=None, tokenizer=train_tokenizer(Path(data_dir)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (HF format)")
    ap.add_argument("--data", type=Path, default=HERE / "data", help="task data (tokenizer corpus)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512)
    args = ap.parse_args()
    out = build(args.out, args.data, seed=args.seed, hidden=args.hidden, layers=args.layers, heads=args.heads,
                kv_heads=args.kv_heads, ffn=args.ffn)
    from safetensors.torch import load_file

    n = sum(t.numel() for t in load_file(str(out / "model.safetensors")).values())
    print(f"wrote {out} ({n / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    main()
