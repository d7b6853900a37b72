"""Build the MoE example's tiny model: the arith example's character-level tokenizer and a random
Qwen3-MoE (8 experts, top-2), saved as a Hugging Face directory (safetensors, per-expert
checkpoint names) that transformers and vLLM load. No downloads.

Run: ``python examples/moe/build_model.py --out examples/moe/artifacts/base``.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from rlweave.testing.tiny_model import build_tiny_qwen3_moe

HERE = Path(__file__).resolve().parent
ARITH = HERE.parent / "arith"


def arith_module():
    """``examples/arith/build_model.py`` as a module: its tokenizer and vLLM check."""
    spec = importlib.util.spec_from_file_location("arith_build_model", ARITH / "build_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(out: str | Path, data_dir: str | Path = ARITH / "data", seed: int = 0, hidden: int = 128,
          layers: int = 4, heads: int = 4, kv_heads: int = 2, experts: int = 8, top_k: int = 2,
          expert_ffn: int = 128, max_positions: int = 256) -> Path:
    """Write tokenizer + random Qwen3-MoE into ``out``; returns ``out``. Every layer is sparse
    (``experts`` experts of width ``expert_ffn``, ``top_k`` per token, routing weights
    renormalised over the top-k); head size ``hidden / heads``; untied embeddings (the
    recorded results were made with them), transformers' own initialisation, greedy generation defaults.
    Same arguments -> same files."""
    tokenizer = arith_module().train_tokenizer(Path(data_dir))
    return build_tiny_qwen3_moe(out, None, hidden, layers, heads, kv_heads, expert_ffn, seed, num_experts=experts,
                                top_k=top_k, norm_topk_prob=True, ffn=4 * hidden,  # dense MLP width: no layer is dense
                                router_aux_loss_coef=0.001, max_positions=max_positions, init_std=None,
                                tokenizer=tokenizer, extra_config={"head_dim": hidden // heads})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (HF format)")
    ap.add_argument("--data", type=Path, default=ARITH / "data", help="task data (tokenizer corpus)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-ffn", type=int, default=128)
    ap.add_argument("--check-vllm", action="store_true", help="load the result in vLLM and generate")
    args = ap.parse_args()
    out = build(args.out, args.data, seed=args.seed, hidden=args.hidden, layers=args.layers, heads=args.heads,
                kv_heads=args.kv_heads, experts=args.experts, top_k=args.top_k, expert_ffn=args.expert_ffn)
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    total = sum(t.numel() for t in weights.values())
    expert = sum(t.numel() for n, t in weights.items() if ".mlp.experts." in n)
    active = total - expert + expert * args.top_k // args.experts
    print(f"wrote {out} ({total / 1e6:.2f}M parameters, {active / 1e6:.2f}M active per token)")
    if args.check_vllm:
        arith_module().check_vllm(out)


if __name__ == "__main__":
    main()
