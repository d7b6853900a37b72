"""Build the tools example's tiny model: a character-level tokenizer whose chat template renders
a tool's answer as ``>answer;``, and a random Qwen2 (~1M parameters), saved as a
Hugging Face directory. No downloads. Run: ``python examples/tools/build_model.py --out
examples/tools/artifacts/base``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlweave.testing.tiny_model import build_tiny_qwen2
from rlweave.testing.tiny_tokenizer import char_tokenizer

#: digits, the operators, and every character of a hermes tool call to the calculator
ALPHABET = "0123456789*+-=()>;" + '<tool_call>{"name":"calculator","arguments":{"expression":}}</tool_call>'
#: user turns as they are, a tool's answer as ">answer;", assistant turns end with EOS (the
#: character tokenizer has no newline)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
    "{% elif m['role'] == 'tool' %}{{ '>' + m['content'] + ';' }}"
    "{% elif m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def build(out: str | Path, seed: int = 0) -> Path:
    tok = char_tokenizer([ALPHABET], max_length=256, chat_template=CHAT_TEMPLATE)
    return build_tiny_qwen2(out, None, 128, 4, 4, 2, 512, seed, max_positions=256, init_std=None, tokenizer=tok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = build(args.out, args.seed)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
