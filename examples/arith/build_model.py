"""Build the example's tiny model: a locally trained character-level tokenizer and a random
Qwen2 (~1M parameters), saved as a Hugging Face directory (safetensors) that transformers
(AutoTokenizer / AutoModelForCausalLM) and vLLM load. No downloads.

Run: ``python build_model.py --out artifacts/base``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "0123456789+-*/=() "
#: prompt/assistant turns concatenated; the assistant turn ends with EOS. Lets algorithms
#: that use chat templates treat {"messages": [...]} like {"query", "response"}.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def corpus(data_dir: Path):
    """Every text of the task's train files (and the alphabet, so no symbol is missing)."""
    yield ALPHABET
    for name in ("sft_train.jsonl", "rl_train.jsonl"):
        path = data_dir / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            yield rec.get("query") or rec.get("prompt") or ""
            yield str(rec.get("response", rec.get("answer", "")))


def train_tokenizer(data_dir: Path):
    """A character-level WordLevel tokenizer trained on the task text, as a
    ``PreTrainedTokenizerFast`` (pad/bos/eos/unk set, no BOS added, chat template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIALS), min_frequency=1, show_progress=False)
    tok.train_from_iterator(corpus(data_dir), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        model_max_length=256, padding_side="left", clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: str | Path, data_dir: str | Path = HERE / "data", seed: int = 0, hidden: int = 128,
          layers: int = 4, heads: int = 4, kv_heads: int = 2, ffn: int = 512, max_positions: int = 256) -> Path:
    """Write tokenizer + random Qwen2 into ``out``; returns ``out``. Same arguments -> same files."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    tokenizer = train_tokenizer(Path(data_dir))
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        use_cache=True,
        **special_ids(tokenizer),
    )
    return save_random(Qwen2ForCausalLM, cfg, tokenizer, out, seed)


def special_ids(tokenizer) -> dict:
    """The model config's ``bos/eos/pad_token_id`` from ``tokenizer``."""
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def save_random(model_cls, cfg, tokenizer, out: Path, seed: int) -> Path:
    """A random fp32 ``model_cls(cfg)`` drawn with ``seed`` (the caller's RNG untouched), with
    greedy generation defaults, saved with ``tokenizer`` under ``out``; returns ``out``."""
    import torch
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(**special_ids(tokenizer), do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


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
