"""Multi-rank scenarios of the DeepSpeed backend against the FSDP backend on the same ranks.

Run in each rank by :func:`rlweave.testing.ranks.run_ranks`; rank 0 returns plain data.
"""

from __future__ import annotations

import os

from rlweave.testing.scenarios import fixed_batch, gather_by_sample, nll_loss, shard_indices, train_worker

OPTIM = {"lr": 3e-3, "grad_clip": 1.0, "warmup_steps": 1, "schedule": "cosine", "total_steps": 10}
#: ZeRO settings compared with FSDP (fp32); the offload rows move state to host memory
VARIANTS = {
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    # no parameter kept whole on every rank (DeepSpeed's default keeps those under 1e5 elements: all of a tiny model)
    "zero3": {"zero_stage": 3, "ds_config": {"zero_optimization": {"stage3_param_persistence_threshold": 0}}},
    "zero3_checkpointing": {"zero_stage": 3, "activation_checkpointing": True},
    "zero2_offload": {"zero_stage": 2, "offload_optimizer": "cpu"},
    "zero3_offload": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    # bf16 parameters and compute, fp32 master weights: close to fp32, not equal
    "zero2_bf16": {"zero_stage": 2, "mixed_precision": "bf16"},
}


def _run(backend: str, ctx_kw: dict, model: dict, shard, idx, steps: int = 2, **options) -> dict:
    w = train_worker(backend, ctx_kw, model, OPTIM, max_tokens_per_micro_batch=32, **options)
    cu = shard.cu_seqlens.tolist()

    def per_sample(x):
        return gather_by_sample({i: x[cu[k]: cu[k + 1]].clone() for k, i in enumerate(idx)})

    out = {"logprobs": per_sample(w.compute_logprobs(shard, with_entropy=True)["logprobs"])}
    out["metrics"] = [w.train_step(shard, nll_loss) for _ in range(steps)]
    out["weights"] = dict(w.named_weights())
    if getattr(w, "base_optimizer", None) is not None:  # the ZeRO optimizer's fp32 master partitions
        out["master_dtypes"] = sorted({str(p.dtype) for g in w.base_optimizer.param_groups for p in g["params"]})
    out["logprobs_after"] = per_sample(w.compute_logprobs(shard)["logprobs"])
    if hasattr(w, "stream_report"):
        out["stream"] = w.stream_report()
    return out


def parity_scenario(ctx_kw: dict, model_dir: str, variants: list[str]) -> dict:
    """FSDP, then each DeepSpeed variant of :data:`VARIANTS`: log-probs, two train steps, the
    weights streamed after them, log-probs after; the ZeRO-3 stream's report on every rank."""
    import torch.distributed as dist

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    full = fixed_batch()
    idx = shard_indices(world, rank, len(full))
    shard = full.select(idx)
    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    res = {"fsdp": _run("fsdp", ctx_kw, model, shard, idx)}
    for name in variants:
        res[name] = _run("deepspeed", ctx_kw, model, shard, idx, **VARIANTS[name])
        streams = [None] * world
        dist.all_gather_object(streams, res[name].get("stream"))
        res[name]["streams"] = streams
    dist.barrier()
    return res if rank == 0 else {}


def export_scenario(ctx_kw: dict, model_dir: str, work: str) -> dict:
    """ZeRO-3 (no parameter kept whole on a rank): one train step, then the streamed weights
    (as an engine receives them), the stream's report on every rank and ``save_hf`` into
    ``work/hf``."""
    import torch.distributed as dist

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    full = fixed_batch()
    shard = full.select(shard_indices(world, rank, len(full)))
    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    w = train_worker("deepspeed", ctx_kw, model, {"lr": 1e-2}, max_tokens_per_micro_batch=64,
                     **VARIANTS["zero3"])
    w.train_step(shard, nll_loss)
    streamed = dict(w.named_weights())
    reports = [None] * world
    dist.all_gather_object(reports, w.stream_report())
    w.save_hf(os.path.join(work, "hf"))
    return {"weights": streamed, "reports": reports} if rank == 0 else {}
