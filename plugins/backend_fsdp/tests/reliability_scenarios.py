"""Scenarios of the FSDP backend's failure guarantees, run on every rank by
:func:`rlweave.testing.ranks.run_ranks` (each rank loads this file again); the backend's
tests and ``tests/reliability/`` load it with :func:`rlweave.testing.helper_modules.import_helper`:

* :func:`nonfinite_scenario`: a NaN in one rank's loss skips the step on every rank, and a
  checkpoint of non-finite state is refused;
* :func:`reshard_scenario`: a DCP checkpoint saved by one world size, loaded by another.

They return plain tensors and floats (all ranks' results, gathered) for the tests to check.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from rlweave.testing.scenarios import fixed_batch, nll_loss, shard_indices, train_worker

BACKEND = "fsdp"
MODEL = {"dtype": "float32", "model_type": "causal_lm"}
OPTIM = {"lr": 3e-3, "grad_clip": 1.0, "warmup_steps": 3, "schedule": "cosine", "total_steps": 10}
BAD_RANK = 1


def nan_gradient_loss(outputs, mb):
    """:func:`nll_loss` times NaN on rank ``BAD_RANK``: NaN loss and NaN gradients there."""
    loss, m = nll_loss(outputs, mb)
    return (loss * float("nan"), m) if dist.get_rank() == BAD_RANK else (loss, m)


def nan_constant_loss(outputs, mb):
    """:func:`nll_loss` plus a NaN constant on rank ``BAD_RANK``: NaN loss, finite gradients."""
    loss, m = nll_loss(outputs, mb)
    return (loss + float("nan"), m) if dist.get_rank() == BAD_RANK else (loss, m)


nan_gradient_loss.needs_entropy = nan_constant_loss.needs_entropy = False


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def local_state(w) -> dict[str, torch.Tensor]:
    """Copies of this rank's parameter and optimizer-state shards, by name."""
    out = {n: _local(p.detach()).clone() for n, p in w.model.named_parameters()}
    names = {id(p): n for n, p in w.model.named_parameters()}
    for p, st in w.optimizer.state.items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[f"{names[id(p)]}[{k}]"] = _local(v.detach()).clone()
    return out


def _max_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        return math.inf
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


def _params(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in s.items() if "[" not in k}  # optimizer state is named "param[key]"


def _all_finite(s: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in s.values() if t.is_floating_point())


def _refused(w, path: str) -> str | None:
    """``save_checkpoint(path)``'s FloatingPointError message, or None if it saved."""
    try:
        w.save_checkpoint(path)
    except FloatingPointError as e:
        return str(e)
    return None


def nonfinite_scenario(ctx_kw: dict, model_dir: str, work: str) -> list[dict]:
    """Step 1 normal; steps 2 and 3 with :func:`nan_gradient_loss` and
    :func:`nan_constant_loss`; step 4 normal, against a worker that ran only steps 1 and 4.
    Then checkpoints: a NaN in one parameter shard of rank ``BAD_RANK``, then in its
    optimizer state (both refused), then restored (saved). Returns every rank's results."""
    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    shard = fixed_batch().select(shard_indices(world, rank, 6))
    model = {"path": model_dir, **MODEL}
    w = train_worker(BACKEND, ctx_kw, model, OPTIM, max_tokens_per_micro_batch=32)
    ref = train_worker(BACKEND, ctx_kw, model, OPTIM, max_tokens_per_micro_batch=32)
    res: dict = {"rank": rank, "first": w.train_step(shard, nll_loss)}
    ref.train_step(shard, nll_loss)
    before, epoch = local_state(w), w.scheduler.last_epoch
    res["bad"] = [w.train_step(shard, fn) for fn in (nan_gradient_loss, nan_constant_loss)]
    after = local_state(w)
    res.update(max_change=_max_change(before, after), finite=_all_finite(after),
               epochs=(epoch, w.scheduler.last_epoch))
    res["next"], res["next_ref"] = w.train_step(shard, nll_loss), ref.train_step(shard, nll_loss)
    res["next_change"] = _max_change(_params(after), _params(local_state(w)))
    res["next_equal_ref"] = _max_change(local_state(w), local_state(ref)) == 0.0
    # checkpoint guard
    name = "model.layers.1.mlp.down_proj.weight"
    param = _local(dict(w.model.named_parameters())[name].detach())
    exp_avg_sq = _local(w.optimizer.state[dict(w.model.named_parameters())[name]]["exp_avg_sq"])
    saves = {}
    for what, t in (("param", param), ("optim", exp_avg_sq)):
        path = os.path.join(work, f"ckpt_{what}")
        keep = t.view(-1)[0].clone()
        if rank == BAD_RANK:
            t.view(-1)[0] = float("nan") if what == "param" else float("inf")
        saves[what] = (_refused(w, path), os.path.exists(path))
        t.view(-1)[0] = keep
    path = os.path.join(work, "ckpt_ok")
    saves["ok"] = (_refused(w, path), os.path.exists(path))
    res["saves"] = saves
    out: list = [None] * world
    dist.all_gather_object(out, res)
    return out


def full_state(w) -> dict:
    """The whole model and optimizer state (unsharded, on CPU; rank 0's copy is complete),
    LR-schedule state and step count, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(w.model, w.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = {f"model/{k}": v.clone() for k, v in msd.items()}
    for fqn, st in osd.get("state", {}).items():  # empty on ranks other than 0
        out.update({f"optim/{fqn}/{k}": v.clone() if torch.is_tensor(v) else v for k, v in st.items()})
    groups = [{k: v for k, v in g.items() if k != "params"} for g in osd.get("param_groups", [])]
    return {"tensors": out, "param_groups": groups, "scheduler": w.scheduler.state_dict(), "step": w.step}


def reshard_scenario(ctx_kw: dict, model_dir: str, load: str | None, save: str | None, steps: int = 2) -> dict:
    """A worker that loads ``load`` (or, when None, trains ``steps`` steps from the model),
    saves ``save`` (when given), and then trains one more step on its shard of the same
    batch. Returns the full state after the load (or the training) and the next step's
    metrics."""
    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    shard = fixed_batch().select(shard_indices(world, rank, 6))
    w = train_worker(BACKEND, ctx_kw, {"path": model_dir, **MODEL}, OPTIM, max_tokens_per_micro_batch=32)
    if load:
        w.load_checkpoint(load)
    else:
        for _ in range(steps):
            w.train_step(shard, nll_loss)
    state = full_state(w)
    if save:
        w.save_checkpoint(save)
    nxt = w.train_step(shard, nll_loss)
    return {"state": state, "next": nxt} if rank == 0 else {}
