"""Multi-rank scenarios of the megatron backend's mixture-of-experts tests (each rank loads this
file again, see :func:`rlweave.testing.ranks.run_ranks`).

:func:`parity_scenario` runs, in one spawn, the FSDP backend's MoE worker and then the megatron
worker with expert parallelism on the same ranks, each data-parallel replica training the same
samples, and returns what the tests compare from rank 0.
"""

from __future__ import annotations

from typing import Any

from rlweave.testing import scenarios as sc

OPTIM = {"lr": 1e-2, "grad_clip": 1.0, "weight_decay": 0.01, "eps": 1e-3}
KERNEL = {"moe_groupgemm": "rlweave_kernel_moe.kernel:KERNEL"}


def _shard(batch, dp: int, dp_rank: int):
    idx = list(range(dp_rank, len(batch), dp))
    return batch.select(idx), idx


def _run(w, dp: int, dp_rank: int, loss, budget_batch) -> dict[str, Any]:
    """Per-sample log-probs of this replica's shard (gathered), one train step, the streamed
    weights after it, and the token-weighted aux loss of the step."""
    import torch.distributed as dist

    shard, idx = _shard(budget_batch, dp, dp_rank)
    out = w.compute_logprobs(shard)["logprobs"]
    cu = shard.cu_seqlens.tolist()
    mine = {i: out[cu[j]:cu[j + 1]].clone() for j, i in enumerate(idx)}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    logprobs: dict = {}
    for d in every:
        logprobs.update(d)
    metrics = w.train_step(shard, loss)
    return {"logprobs": logprobs, "metrics": metrics, "weights": dict(w.named_weights())}


def parity_scenario(ctx_kw: dict, model_dir: str, work: str, parallel: dict, budget: int,
                    kernel: bool) -> dict[str, Any]:
    """The FSDP worker at ``dp = world`` (one rank per replica), then the megatron worker with
    ``parallel`` (its data-parallel replicas the same samples), both with ``budget`` tokens per
    micro-batch and the ``moe_groupgemm`` kernel when ``kernel``; rank 0 returns
    ``{"fsdp": ..., "megatron": ...}`` plus the megatron ranks' parameter counts."""
    import torch.distributed as dist

    kw = {**ctx_kw, "kernels": KERNEL} if kernel else ctx_kw
    world = ctx_kw["world_size"]
    model = {"path": model_dir, "dtype": "float32"}
    batch = sc.fixed_batch()
    fsdp = sc.train_worker("fsdp", kw, model, OPTIM, max_tokens_per_micro_batch=budget, moe_aux_loss_coef=0.05)
    res = {"fsdp": _run(fsdp, world, ctx_kw["rank"], sc.nll_loss, batch)}
    del fsdp
    w = sc.train_worker("megatron", kw, model, OPTIM, parallel, max_tokens_per_micro_batch=budget,
                        moe_aux_loss_coef=0.05)
    res["megatron"] = _run(w, w.dp, w.dp_rank, sc.nll_loss, batch)
    counts = {"experts": sum(p.numel() for n, p in w.model.named_parameters() if ".mlp.experts." in n),
              "rest": sum(p.numel() for n, p in w.model.named_parameters() if ".mlp.experts." not in n),
              "ep_rank": w.ep_rank}
    every: list = [None] * world
    dist.all_gather_object(every, counts)
    res["param_counts"] = every
    w.save_hf(f"{work}/hf")
    w.save_checkpoint(f"{work}/ckpt")
    w.shutdown()
    return res


def reload_scenario(ctx_kw: dict, model_dir: str, ckpt: str, parallel: dict) -> dict[str, Any]:
    """A megatron worker with ``parallel`` loading the checkpoint ``ckpt``: its streamed weights."""
    w = sc.train_worker("megatron", ctx_kw, {"path": model_dir, "dtype": "float32"}, OPTIM, parallel,
                        moe_aux_loss_coef=0.05)
    w.load_checkpoint(ckpt)
    weights = dict(w.named_weights())
    w.shutdown()
    return {"weights": weights, "step": w.step}

