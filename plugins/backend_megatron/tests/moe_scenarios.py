"""Multi-rank scenarios of the megatron backend's mixture-of-experts tests (each rank loads this
file again, see :func:`rlweave.testing.ranks.run_ranks`).

:func:`parity_scenario` runs, in one spawn, the FSDP backend's MoE worker and then the megatron
worker with expert parallelism on the same ranks, each data-parallel replica training the same
samples, and returns what the tests compare from rank 0. Router replay rides along in the same
spawn (:func:`_passes`, :func:`_replay_step`): a routing that shares no expert with the router's
own on any token, replayed by both backends' log-prob passes (megatron's packed, then right-padded
by switching its ``use_packing`` option between passes), then one more training step of each under
it, megatron's on a worker with activation recomputation that loads the first one's checkpoint
(on right-padded rows when asked). The replayed step keeps the load-balancing loss, so the routers'
gradients come from the replayed experts' weights and from the aux loss, whose gradient megatron
must carry through the recomputed forward.
"""

from __future__ import annotations

from typing import Any

from rlweave.testing import scenarios as sc

OPTIM = {"lr": 1e-2, "grad_clip": 1.0, "weight_decay": 0.01, "eps": 1e-3}
KERNEL = {"moe_groupgemm": "rlweave_kernel_moe.kernel:KERNEL"}
#: the router weights of the tiny model's two MoE layers, by backend
FSDP_ROUTERS = ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight")
MEGATRON_ROUTERS = ("decoder.layers.0.mlp.router.weight", "decoder.layers.1.mlp.router.weight")


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


def _per_sample(batch, idx: list[int], x) -> dict:
    cu = batch.cu_seqlens.tolist()
    return {i: x[cu[j]:cu[j + 1]].clone() for j, i in enumerate(idx)}


def _foreign(own, experts: int):
    """A routing that shares no expert with ``own`` ``(T, layers, k)`` on any token and layer
    (``k`` of the other experts, which ones varying with the token)."""
    import torch

    t, _, k = own.shape
    taken = torch.zeros(*own.shape[:2], experts, dtype=torch.bool).scatter_(-1, own.long(), True)
    turn = (torch.arange(experts).view(1, 1, -1) + torch.arange(t).view(-1, 1, 1)) % experts
    return ((~taken).float() * experts + turn.float()).topk(k, dim=-1).indices.to(own.dtype)


def _with_routing(shard, idx: list[int], given: dict):
    import torch

    b = shard.shallow_copy()
    b.add_token("routing", torch.cat([given[i] for i in idx]))
    return b


def _passes(w, shard, idx: list[int], experts: int, given: dict | None = None) -> dict:
    """Log-prob passes of ``w`` on its shard, gathered by sample: the routing it records
    (``own``), a foreign routing (``given``; made from ``own`` when None) replayed and recorded
    (``chosen``), and a pass after it without routing (``lp_again``)."""
    own = w.compute_logprobs(shard, with_routing=True)
    mine = _per_sample(shard, idx, _foreign(own["routing"], experts)) if given is None else None
    given = sc.gather_by_sample(mine) if given is None else given
    rep = w.compute_logprobs(_with_routing(shard, idx, given), with_routing=True)
    again = w.compute_logprobs(shard)
    out = {"own": own["routing"], "lp_own": own["logprobs"], "chosen": rep["routing"], "lp_replay": rep["logprobs"],
           "lp_again": again["logprobs"]}
    res = {k: sc.gather_by_sample(_per_sample(shard, idx, v)) for k, v in out.items()}
    return {**res, "given": given}


def _replay_step(w, shard, idx: list[int], given: dict, routers: tuple[str, ...]) -> dict:
    """One train step of ``w`` under the routing ``given`` (the step's metrics and the summed
    gradients of the ``routers`` weights, from the ranks whose optimizer steps them), then, on the
    weights after it, the replayed pass's token-weighted log-prob sum (``wlp_pass``, over every
    rank: one rank per replica) and the training forward's (``wlp_train``)."""
    import torch.distributed as dist

    b = _with_routing(shard, idx, given)
    metrics, grads = sc.train_step_with_grads(w, b, sc.nll_loss)
    owns = getattr(w, "owns", lambda name: True)  # megatron's sharded optimizer: only the owner's is summed
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, {r: grads[r] for r in routers if owns(r)})
    summed = {k: v for d in every for k, v in d.items()}
    lp = w.compute_logprobs(b)["logprobs"]
    dist.all_gather_object(every, float((b.token["token_weight"] * lp).sum()))
    wlp = w.train_step(b, sc.TemperedLogprobSum(1.0))["wlp"]
    return {"metrics": metrics, "router_grads": [summed[r] for r in routers], "wlp_train": wlp, "wlp_pass": sum(every)}


def parity_scenario(ctx_kw: dict, model_dir: str, work: str, parallel: dict, budget: int,
                    kernel: bool, experts: int = 8, padded_step: bool = False) -> dict[str, Any]:
    """The FSDP worker at ``dp = world`` (one rank per replica), then the megatron worker with
    ``parallel`` (its data-parallel replicas the same samples), both with ``budget`` tokens per
    micro-batch and the ``moe_groupgemm`` kernel when ``kernel``; rank 0 returns
    ``{"fsdp": ..., "megatron": ...}`` plus the megatron ranks' parameter counts, and the router
    replay results of both (``*_replay``: log-prob passes, ``*_replay_step``: a second step under
    the replayed routing, see the module docstring; megatron's on right-padded rows with
    ``padded_step``: give a budget under which both backends form the same micro-batches)."""
    import torch.distributed as dist

    kw = {**ctx_kw, "kernels": KERNEL} if kernel else ctx_kw
    world = ctx_kw["world_size"]
    model = {"path": model_dir, "dtype": "float32"}
    batch = sc.fixed_batch()
    fsdp = sc.train_worker("fsdp", kw, model, OPTIM, max_tokens_per_micro_batch=budget, moe_aux_loss_coef=0.05)
    shard, idx = _shard(batch, world, ctx_kw["rank"])
    res = {"fsdp_replay": _passes(fsdp, shard, idx, experts)}
    given = res["fsdp_replay"]["given"]
    res["fsdp"] = _run(fsdp, world, ctx_kw["rank"], sc.nll_loss, batch)
    res["fsdp_replay_step"] = _replay_step(fsdp, shard, idx, given, FSDP_ROUTERS)
    del fsdp
    w = sc.train_worker("megatron", kw, model, OPTIM, parallel, max_tokens_per_micro_batch=budget,
                        moe_aux_loss_coef=0.05)
    shard, idx = _shard(batch, w.dp, w.dp_rank)
    res["megatron_replay"] = _passes(w, shard, idx, experts, given)
    w.cfg.use_packing = False  # the same worker's passes on right-padded rows
    res["megatron_replay_padded"] = _passes(w, shard, idx, experts, given)
    w.cfg.use_packing = True
    res["megatron"] = _run(w, w.dp, w.dp_rank, sc.nll_loss, batch)
    counts = {"experts": sum(p.numel() for n, p in w.model.named_parameters() if ".mlp.experts." in n),
              "rest": sum(p.numel() for n, p in w.model.named_parameters() if ".mlp.experts." not in n),
              "ep_rank": w.ep_rank}
    every: list = [None] * world
    dist.all_gather_object(every, counts)
    res["param_counts"] = every
    w.save_hf(f"{work}/hf")
    w.save_checkpoint(f"{work}/ckpt")
    del w  # the process group stays for the next worker (its init rebuilds megatron's groups)
    w = sc.train_worker("megatron", kw, model, OPTIM, parallel, max_tokens_per_micro_batch=budget,
                        moe_aux_loss_coef=0.05, activation_checkpointing=True, use_packing=not padded_step)
    w.load_checkpoint(f"{work}/ckpt")
    res["megatron_replay_step"] = _replay_step(w, shard, idx, given, MEGATRON_ROUTERS)
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

