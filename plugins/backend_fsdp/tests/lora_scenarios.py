"""Multi-rank LoRA scenarios of the FSDP backend (loaded in each rank by
:func:`rlweave.testing.ranks.run_ranks`); rank 0 returns plain tensors and floats."""

from __future__ import annotations

import os

import torch
from rlweave.testing.scenarios import fixed_batch, gather_by_sample, nll_loss, shard_indices, train_worker, value_loss

LORA = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
OPTIM = {"lr": 1e-2, "grad_clip": 1.0}


def _full_state(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            for n, t in model.state_dict().items()}


def lora_scenario(ctx_kw: dict, model_dir: str, work: str) -> dict:
    """A LoRA policy and a plain one on the same base model: log-probs with adapters off
    (before and after training) against the plain model's; which parameters two steps change;
    merged streaming; a checkpoint at step 2 resumed into a fresh worker; adapter and merged
    exports; the same steps with activation checkpointing; a critic with adapters."""
    import torch.distributed as dist

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    full = fixed_batch()
    idx = shard_indices(world, rank, len(full))
    shard = full.select(idx)
    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    cu = shard.cu_seqlens.tolist()

    def lp(w, **kw) -> dict[int, torch.Tensor]:
        x = w.compute_logprobs(shard, **kw)["logprobs"]
        return gather_by_sample({i: x[cu[k] : cu[k + 1]].clone() for k, i in enumerate(idx)})

    res: dict = {}
    plain = train_worker("fsdp", ctx_kw, model, None, max_tokens_per_micro_batch=32)
    res["plain"] = lp(plain)
    del plain
    kw = {"max_tokens_per_micro_batch": 32}
    a = train_worker("fsdp", {**ctx_kw, "lora": LORA}, model, OPTIM, **kw)
    res["trainable"] = sorted(n for n, p in a.model.named_parameters() if p.requires_grad)
    res["optim_params"] = sum(len(g["params"]) for g in a.optimizer.param_groups)
    res["start"] = lp(a)
    before = _full_state(a.model)
    res["metrics"] = [a.train_step(shard, nll_loss) for _ in range(2)]
    after = _full_state(a.model)
    res["changed"] = sorted(n for n in before if not torch.equal(before[n], after[n]))
    res["unchanged"] = sorted(n for n in before if torch.equal(before[n], after[n]))
    res["disabled"] = lp(a, adapters=False)
    res["trained"] = lp(a)
    res["merged"] = dict(a.named_weights())
    ckpt = os.path.join(work, "ckpt")
    a.save_checkpoint(ckpt)
    res["next"] = [a.train_step(shard, nll_loss) for _ in range(2)]
    res["after_next"] = lp(a)
    b = train_worker("fsdp", {**ctx_kw, "lora": LORA}, model, OPTIM, **kw)
    b.load_checkpoint(ckpt)
    res["resumed"] = [b.train_step(shard, nll_loss) for _ in range(2)]
    res["after_resumed"] = lp(b)
    b.save_adapter(os.path.join(work, "adapter"))
    b.save_hf(os.path.join(work, "merged"))
    del a, b
    ac = train_worker("fsdp", {**ctx_kw, "lora": LORA}, model, OPTIM, activation_checkpointing=True, **kw)
    res["checkpointed"] = [ac.train_step(shard, nll_loss) for _ in range(2)]
    del ac
    critic = train_worker("fsdp", {**ctx_kw, "lora": LORA}, {**model, "model_type": "value"}, OPTIM, **kw)
    res["critic_trainable"] = sorted(n for n, p in critic.model.named_parameters() if p.requires_grad)
    res["critic_metrics"] = [critic.train_step(shard, value_loss) for _ in range(3)]
    dist.barrier()
    return res if rank == 0 else {}
