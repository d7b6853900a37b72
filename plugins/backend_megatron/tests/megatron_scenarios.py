"""Multi-rank scenarios of the megatron backend's tests (each rank loads this file again, see
:func:`rlweave.testing.ranks.run_ranks`).

Each builds the real ``MegatronWorker`` on every rank (gloo on CPU, NCCL on CUDA), runs the
operations on the batches of :mod:`rlweave.testing.scenarios` and returns plain tensors from
rank 0; the tests compare them with transformers and with the FSDP backend (:func:`fsdp_policy`,
the same worker contract driven by backend name).
"""

from __future__ import annotations

from typing import Any

import torch
from rlweave.testing import scenarios as sc

OPTIM = {"lr": 1e-2, "grad_clip": 1.0, "weight_decay": 0.01, "eps": 1e-3}


def worker(ctx_kw: dict, model: dict, parallel: dict, optim: dict | None = OPTIM, **options):
    """A built ``MegatronWorker`` of role ``policy`` (seed 3) with ``parallel`` sizes and ``options``."""
    return sc.train_worker("megatron", ctx_kw, model, optim, parallel, **options)


def replica_shard(w, batch):
    """The samples of ``batch`` this rank's data-parallel replica gets (every other one)."""
    idx = list(range(w.dp_rank, len(batch), w.dp))
    return batch.select(idx), idx


def hf_weights(w) -> dict[str, torch.Tensor]:
    """Every HF-named tensor streamed by ``named_weights`` (rank 0; empty elsewhere)."""
    return {n: t for n, t in w.named_weights()}


def policy_scenario(ctx_kw: dict, model_dir: str, work: str, parallel: dict, budget: int = 64,
                    with_step: bool = True, options: dict | None = None) -> dict[str, Any]:
    """Log-probs and entropy of the fixed batch, one NLL train step, the streamed weights after
    it and an HF export under ``work``; ``options``: more backend options."""
    import torch.distributed as dist

    w = worker(ctx_kw, {"path": model_dir, "dtype": "float32"}, parallel, max_tokens_per_micro_batch=budget,
               **(options or {}))
    batch = sc.fixed_batch()
    shard, idx = replica_shard(w, batch)
    out = w.compute_logprobs(shard, with_entropy=True)
    try:  # a dense model has no routing to record (refused before any collective)
        w.compute_logprobs(shard, with_routing=True)
        refusal = None
    except ValueError as exc:
        refusal = str(exc)
    per = {"logprobs": {}, "entropy": {}}
    cu = shard.cu_seqlens.tolist()
    for j, i in enumerate(idx):
        for k in per:
            per[k][i] = out[k][cu[j]:cu[j + 1]].clone()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, per)
    res: dict[str, Any] = {k: {} for k in per}
    res["routing_refusal"] = refusal
    for d in gathered:
        for k in per:
            res[k].update(d[k])
    if with_step:
        res["metrics"] = w.train_step(shard, sc.nll_loss)
        res["weights"] = hf_weights(w)
        mine = (w.stream_peak_bytes, sum(p.numel() * p.element_size() for p in w.model.parameters()))
        peaks: list = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, mine)
        res["stream_peak_bytes"] = [p for p, _ in peaks]
        res["shard_bytes"] = [s for _, s in peaks]
        state = sum(v.numel() for st in w.optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim())
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, (state, sum(p.numel() for p in w.model.parameters())))
        res["optim_state_numel"] = [a for a, _ in every]
        res["param_numel"] = [b for _, b in every]
        after = w.compute_logprobs(shard)["logprobs"]
        res["logprobs_after"] = {i: after[cu[j]:cu[j + 1]].clone() for j, i in enumerate(idx)}
        w.save_hf(f"{work}/hf")
    w.shutdown()
    return res


def heads_scenario(ctx_kw: dict, model_dir: str, kinds: list[str], parallel: dict,
                   variants: list[dict] | None = None) -> list[dict[str, dict[str, Any]]]:
    """For each of ``variants`` (backend options; default: one with none) and each of
    ``kinds``, one worker after the other in this spawn (sharing its process group, which the
    last one shuts down): values (``value``) or scores (``reward``) of the fixed batch, for
    ``value`` then one train step on a squared-error loss, and the streamed weights after it;
    by variant, then kind."""
    out: list[dict[str, dict[str, Any]]] = []
    w = None
    for options in variants or [{}]:
        by_kind: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            w = worker(ctx_kw, {"path": model_dir, "dtype": "float32", "model_type": kind}, parallel, **options)
            batch = sc.fixed_batch()
            res: dict[str, Any] = {}
            if kind == "value":
                res["values"] = w.compute_values(batch)
                res["metrics"] = w.train_step(batch, sc.value_loss)
            else:
                res["scores"] = w.compute_scores(batch)
            res["weights"] = hf_weights(w)
            by_kind[kind] = res
        out.append(by_kind)
    if w is not None:
        w.shutdown()
    return out


def _fsdp_run(ctx_kw: dict, model_dir: str, kind: str) -> tuple[Any, dict[str, Any]]:
    w = sc.train_worker("fsdp", ctx_kw, {"path": model_dir, "dtype": "float32", "model_type": kind}, OPTIM,
                        max_tokens_per_micro_batch=64)
    batch = sc.fixed_batch()
    res: dict[str, Any] = {}
    if kind == "value":
        res["values"] = w.compute_values(batch)
        res["metrics"] = w.train_step(batch, sc.value_loss)
    elif kind == "reward":
        res["scores"] = w.compute_scores(batch)
    else:
        res["metrics"] = w.train_step(batch, sc.nll_loss)
    res["weights"] = dict(w.named_weights())
    return w, res


def fsdp_policy(ctx_kw: dict, model_dir: str, kind: str = "causal_lm") -> dict[str, Any]:
    """The FSDP backend on one rank, same batch, loss and optimizer: outputs, step metrics and
    the weights after the step."""
    w, res = _fsdp_run(ctx_kw, model_dir, kind)
    w.shutdown()
    return res


def fsdp_references(ctx_kw: dict, runs: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """:func:`fsdp_policy` of each ``name: (model_dir, kind)`` of ``runs``, one worker after the
    other in this spawn (sharing its process group, which the last one shuts down); by name."""
    out: dict[str, dict[str, Any]] = {}
    w = None
    for name, (model_dir, kind) in runs.items():
        w, out[name] = _fsdp_run(ctx_kw, model_dir, kind)
    if w is not None:
        w.shutdown()
    return out


def resume_scenario(ctx_kw: dict, model_dir: str, ckpt: str, parallel: dict, save: bool,
                    options: dict | None = None) -> dict[str, Any]:
    """``save``: one step, checkpoint into ``ckpt``, then a second step; else: load ``ckpt``
    and take the second step (each data-parallel replica on its share of the batches); ``options``:
    more backend options. Returns the second step's metrics, log-probs of a third batch,
    the weights after it and each rank's peak bytes while they were streamed."""
    import torch.distributed as dist

    w = worker(ctx_kw, {"path": model_dir, "dtype": "float32"}, parallel, max_tokens_per_micro_batch=64,
               **(options or {}))
    if save:
        w.train_step(replica_shard(w, sc.fixed_batch())[0], sc.nll_loss)
        w.save_checkpoint(ckpt)
    else:
        w.load_checkpoint(ckpt)
    res = {"step": w.step, "metrics": w.train_step(replica_shard(w, sc.fixed_batch(seed=4))[0], sc.nll_loss),
           "logprobs": w.compute_logprobs(sc.fixed_batch(seed=5))["logprobs"], "weights": hf_weights(w)}
    peaks: list = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, w.stream_peak_bytes)
    res["stream_peak_bytes"] = peaks
    w.shutdown()
    return res


def schedule_scenario(ctx_kw: dict, model_dir: str, parallel: dict, counts: list[int]) -> dict[str, Any]:
    """Gradients of one step's micro-batches under the ``1f1b`` and the ``sequential`` pipeline
    schedule (packed micro-batches), and under ``1f1b`` with right-padded rows, same worker and
    weights: for each of ``counts`` micro-batches (12 samples, two fixed batches, split
    round-robin), per rank the largest difference of any gradient and of the loss sum between
    the schedules (``grad_diff``, ``loss_diff``) and between packed and padded rows
    (``padded_grad_diff``, ``padded_loss_diff``), and the 1F1B loss sum."""
    import torch.distributed as dist
    from rlweave.data.batch import Batch

    w = worker(ctx_kw, {"path": model_dir, "dtype": "float32"}, parallel)
    batch = Batch.concat([sc.fixed_batch(seed=0), sc.fixed_batch(seed=1)])
    batch.add_token("token_weight", batch.token["loss_mask"] / batch.token["loss_mask"].sum())
    res: dict[str, Any] = {}

    def diff(a: dict, b: dict) -> float:
        return max((a[k] - g).abs().max().item() for k, g in b.items())

    for n in counts:
        groups = [g for g in (list(range(k, len(batch), n)) for k in range(n)) if g]
        grads, sums = {}, {}
        for name, schedule, packing in (("1f1b", "1f1b", True), ("sequential", "sequential", True),
                                        ("padded", "1f1b", False)):
            w.cfg.pipeline_schedule, w.cfg.use_packing = schedule, packing
            w.model.zero_grad(set_to_none=True)
            sums[name], _ = w._accumulate(batch, groups, n, sc.nll_loss, 1.0, False)
            grads[name] = {k: p.grad.clone() for k, p in w.model.named_parameters() if p.grad is not None}
        mine = {"grad_diff": diff(grads["1f1b"], grads["sequential"]),
                "padded_grad_diff": diff(grads["1f1b"], grads["padded"]),
                "same_params": sorted(grads["1f1b"]) == sorted(grads["sequential"]) == sorted(grads["padded"])
                and len(grads["1f1b"]) > 0,
                "loss_diff": abs(sums["1f1b"] - sums["sequential"]),
                "padded_loss_diff": abs(sums["1f1b"] - sums["padded"]), "loss": sums["1f1b"]}
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        res[n] = every
    w.model.zero_grad(set_to_none=True)
    w.shutdown()
    return res


def master_scenario(ctx_kw: dict, model_dir: str, steps: int, lr: float, ckpt: str) -> dict[str, Any]:
    """``steps`` NLL steps on the same batches by three one-rank workers, one after the other:
    fp32; bf16 with fp32 master weights; bf16 without. Per parameter (megatron names): the fp32
    run's weights before and after, the bf16 run's masters (and their dtype) and parameters, and
    the plain bf16 run's parameters, all as fp32. The bf16 run with masters also saves a
    checkpoint into ``ckpt``, which a fresh bf16 worker loads: its masters and AdamW state
    (``reloaded``, ``reloaded_state``) against the saved run's (``state``)."""
    optim = {**OPTIM, "lr": lr, "grad_clip": 0.0, "weight_decay": 0.0}
    runs = {"fp32": ("float32", True), "master": ("bfloat16", True), "plain": ("bfloat16", False)}
    out: dict[str, Any] = {}
    w = None
    for name, (dtype, masters) in runs.items():
        w = worker(ctx_kw, {"path": model_dir, "dtype": dtype}, {}, optim, master_weights=masters)
        if name == "fp32":
            out["before"] = {k: p.detach().float().clone() for k, p in w.model.named_parameters()}
        for s in range(steps):
            w.train_step(sc.fixed_batch(seed=10 + s), sc.nll_loss)
        out[name] = {k: p.detach().float().clone() for k, p in w.model.named_parameters()}
        if name == "master":
            out["masters"] = {k: w.main(p).detach().clone() for k, p in w.model.named_parameters()}
            out["state"] = {k: w.optimizer.state[w.main(p)]["exp_avg_sq"].clone() for k, p in w.model.named_parameters()}
            w.save_checkpoint(ckpt)
            again = worker(ctx_kw, {"path": model_dir, "dtype": dtype}, {}, optim)
            again.load_checkpoint(ckpt)
            out["reloaded"] = {k: again.main(p).detach().clone() for k, p in again.model.named_parameters()}
            out["reloaded_params"] = {k: p.detach().float().clone() for k, p in again.model.named_parameters()}
            out["reloaded_state"] = {k: again.optimizer.state[again.main(p)]["exp_avg_sq"].clone()
                                     for k, p in again.model.named_parameters()}
            out["param_dtypes"] = sorted({str(p.dtype) for p in w.model.parameters()})
            out["optim_dtypes"] = sorted({str(v.dtype) for st in w.optimizer.state.values()
                                          for v in st.values() if torch.is_tensor(v) and v.dim() > 0})
    if w is not None:
        w.shutdown()
    return out
