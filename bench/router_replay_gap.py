"""How much of a low-precision engine's log-prob gap is MoE routing: trainer/engine |delta log-prob|
without and with router replay (R3), per model, in one table.

For each model, responses are sampled from it in ``--engine-dtype`` (transformers ``generate``,
temperature 1, up to ``--new-tokens`` or the model's end-of-sequence token). Then each sampled
sequence gets three forwards:

* one in the engine dtype: the engine's log-probs, and its routing recorded with the hooks the FSDP
  backend replays with (:class:`rlweave.backend_helpers.router_replay.RouterReplay`);
* one in fp32 with the routers choosing: the trainer without replay;
* one in fp32 replaying the engine's routing: the trainer with R3.

Printed per model:

* ``decisions changed``: the share of routing decisions (a token in one MoE layer) where the fp32
  routers choose other experts than the engine (``moe_replay_changed_frac`` of the replayed pass);
* ``tokens changed``: the share of response tokens with such a decision in at least one layer;
* over the response tokens, with ``d = log p_trainer - log p_engine``: the mean, p99 and max of ``|d|``,
  and k3 (``mean(exp(d) - 1 - d)``), without replay and with it, and the ratio of each.

The engine's log-probs come from one full forward in its dtype, not from an inference engine's
decode steps, so what replay leaves is the dtype's share of the gap (rounded weights and
arithmetic). ``bench/mismatch.py`` measures whole training runs with an engine.

A model is a directory (a transformers MoE model with its tokenizer; the prompts are the first
``--prompts`` of ``--data``), or ``random:LxExK``: a random Qwen3-MoE (hidden 128) with L layers, E
experts and top-K, built in a temporary directory, with random prompt ids. Run from the
repository root:

    python bench/router_replay_gap.py --models runs/moe-sft/hf,random:4x8x2,random:8x64x8
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "arith" / "data" / "test.jsonl"


def build(spec: str, tmp: str) -> Path:
    """The model directory of ``spec`` (a path, or ``random:LxExK`` built under ``tmp``)."""
    if not spec.startswith("random:"):
        path = Path(spec)
        if not (path / "config.json").is_file():
            raise SystemExit(f"bench/router_replay_gap.py: --models: {spec} is not a model directory (no config.json)")
        return path
    try:
        layers, experts, top_k = (int(x) for x in spec.split(":", 1)[1].split("x"))
    except ValueError:
        raise SystemExit(f"bench/router_replay_gap.py: --models: {spec!r}: write random:LxExK, "
                         "e.g. random:8x64x8") from None
    from rlweave.testing.tiny_model import build_tiny_qwen3_moe

    return build_tiny_qwen3_moe(Path(tmp) / spec.replace(":", "-"), hidden=128, layers=layers, heads=4, kv_heads=2,
                                moe_ffn=64, seed=1, num_experts=experts, top_k=top_k)


def prompts(model_dir: Path, n: int, data: Path, seed: int) -> list:
    """``n`` prompts as ``(1, len)`` id tensors: from ``data`` with the model's tokenizer, or random ids."""
    import torch

    if (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        with open(data) as f:
            rows = [json.loads(line) for _, line in zip(range(n), f)]
        return [tok(r["prompt"], return_tensors="pt").input_ids for r in rows]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 100, (1, 12), generator=g) for _ in range(n)]


def measure(model_dir: Path, ids_list: list, engine_dtype: str, new_tokens: int, seed: int) -> dict:
    """The row of one model (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlweave.backend_helpers.hf_model.moe_blocks import find_blocks
    from rlweave.backend_helpers.router_replay import CHANGED, RouterReplay

    torch.manual_seed(seed)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, engine_dtype)).eval()
    hooks = {"trainer": RouterReplay(find_blocks(trainer)), "engine": RouterReplay(find_blocks(engine))}
    if not hooks["trainer"].layers:
        raise SystemExit(f"bench/router_replay_gap.py: {model_dir} has no MoE layers")

    def logprobs(model, seq):
        logits = model(input_ids=seq).logits.float()
        return torch.log_softmax(logits, -1)[0, :-1].gather(-1, seq[0, 1:, None])[:, 0]

    gaps = {"none": [], "r3": []}
    flipped = []
    hooks["trainer"].tally.reset(torch.device("cpu"))  # counts the replayed passes of every sequence
    t0 = time.perf_counter()
    with torch.no_grad():
        for ids in ids_list:
            seq = engine.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=new_tokens, pad_token_id=0)
            n = ids.shape[1]
            hooks["engine"].set(None, record=True)
            lp_engine = logprobs(engine, seq)
            routing = hooks["engine"].take()  # (tokens, layers, top_k)
            hooks["engine"].set(None)
            hooks["trainer"].set(None, record=True)
            lp_free = logprobs(trainer, seq)
            own = hooks["trainer"].take()
            hooks["trainer"].set(routing)
            lp_r3 = logprobs(trainer, seq)
            hooks["trainer"].set(None)
            resp = slice(n - 1, None)  # the log-probs of the response tokens
            gaps["none"].append((lp_free - lp_engine)[resp])
            gaps["r3"].append((lp_r3 - lp_engine)[resp])
            differs = (own.sort(-1).values != routing.sort(-1).values).any(-1).any(-1)  # per position
            flipped.append(differs[n - 1 : -1].float())  # a response token's log-prob reads its position's routing
    row = {"model": str(model_dir), "tokens": int(sum(len(g) for g in gaps["none"])),
           "decisions_changed": hooks["trainer"].tally.metrics().get(CHANGED, 0.0),
           "tokens_changed": float(torch.cat(flipped).mean()), "wall_s": time.perf_counter() - t0}
    for name, parts in gaps.items():
        d = torch.cat(parts).double()
        a = d.abs()
        row[name] = {"mean": float(a.mean()), "p99": float(a.quantile(0.99)), "max": float(a.max()),
                     "k3": float((d.exp() - 1 - d).mean())}
    for h in hooks.values():
        h.remove()
    return row


def table(rows: list[dict]) -> str:
    """The markdown table of the rows."""
    head = ["model", "response tokens", "decisions changed", "tokens changed"]
    for stat in ("mean", "p99", "max", "k3"):
        head += [f"{stat} none", f"{stat} r3", f"{stat} none/r3"]
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], str(r["tokens"]), f"{r['decisions_changed']:.2%}", f"{r['tokens_changed']:.1%}"]
        for stat in ("mean", "p99", "max", "k3"):
            a, b = r["none"][stat], r["r3"][stat]
            cells += [f"{a:.1e}", f"{b:.1e}", f"{a / b:.1f}x" if b > 0 else "inf"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="runs/moe-sft/hf,random:4x8x2,random:8x64x8",
                    help="comma-separated model directories or random:LxExK")
    ap.add_argument("--prompts", type=int, default=128, help="prompts per model")
    ap.add_argument("--data", default=str(DATA), help="jsonl with a 'prompt' field (models with a tokenizer)")
    ap.add_argument("--new-tokens", type=int, default=6, help="sampled response tokens per prompt")
    ap.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    a = ap.parse_args()
    print(f"# {datetime.date.today()}, {cpu_name()}; engine {a.engine_dtype}, trainer float32, {a.prompts} prompts "
          f"x {a.new_tokens} sampled tokens, seed {a.seed}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlweave-replay-gap-") as tmp:
        for spec in (s for s in a.models.split(",") if s):
            path = build(spec, tmp)
            r = measure(path, prompts(path, a.prompts, Path(a.data), a.seed), a.engine_dtype, a.new_tokens, a.seed)
            r["label"] = spec
            rows.append(r)
            print(f"{spec}: decisions changed {r['decisions_changed']:.2%}, mean |dlogp| {r['none']['mean']:.2e} "
                  f"-> {r['r3']['mean']:.2e} with replay, {r['wall_s']:.0f} s", flush=True)
    print()
    print(table(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
