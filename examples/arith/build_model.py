"""Build the example's tiny model: a locally trained character-level tokenizer and a random
Qwen2 (~1M parameters), saved as a Hugging Face directory (safetensors) that transformers
(AutoTokenizer / AutoModelForCausalLM) and vLLM load. No downloads.

Run: ``python build_model.py --out artifacts/base``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlweave.testing.tiny_model import build_tiny_qwen2
from rlweave.testing.tiny_tokenizer import char_tokenizer, task_texts

HERE = Path(__file__).resolve().parent
ALPHABET = "0123456789+-*/=() "


def train_tokenizer(data_dir: Path):
    """A character-level tokenizer trained on the task text (the alphabet and every text of the
    train files), as a ``PreTrainedTokenizerFast`` (pad/bos/eos/unk set, no BOS added, chat
    template: :func:`rlweave.testing.tiny_tokenizer.char_tokenizer`)."""
    return char_tokenizer(task_texts(data_dir, ALPHABET), max_length=256)


def build(out: str | Path, data_dir: str | Path = HERE / "data", seed: int = 0, hidden: int = 128,
          layers: int = 4, heads: int = 4, kv_heads: int = 2, ffn: int = 512, max_positions: int = 256) -> Path:
    """Write tokenizer + random fp32 Qwen2 (transformers' own initialisation, untied embeddings,
    greedy generation defaults) into ``out``; returns ``out``. Same arguments -> same files."""
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
    ap.add_argument("--check-vllm", action="store_true", help="load the result in vLLM and generate")
    args = ap.parse_args()
    out = build(args.out, args.data, seed=args.seed, hidden=args.hidden, layers=args.layers, heads=args.heads,
                kv_heads=args.kv_heads, ffn=args.ffn)
    from safetensors.torch import load_file

    n = sum(t.numel() for t in load_file(str(out / "model.safetensors")).values())
    print(f"wrote {out} ({n / 1e6:.2f}M parameters)")
    if args.check_vllm:
        check_vllm(out)


def check_vllm(path: Path) -> None:
    """Load ``path`` in vLLM (CPU-friendly settings) and greedily complete two prompts."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(path), dtype="float32", gpu_memory_utilization=0.1, max_model_len=128,
              enforce_eager=True, seed=0)
    for o in llm.generate(["12+7=", "30-4="], SamplingParams(max_tokens=4, temperature=0.0)):
        print(f"vLLM: {o.prompt!r} -> {o.outputs[0].text!r} (token ids {list(o.outputs[0].token_ids)})")


if __name__ == "__main__":
    main()
