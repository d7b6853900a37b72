"""Mixture-of-experts scenarios of the FSDP backend for the CPU and GPU tests (each rank loads
this file again, see :func:`rlweave.testing.ranks.run_ranks`).

Each runs the real ``FSDPWorker`` on every rank over tiny random MoE checkpoints
(:mod:`rlweave.testing.tiny_model`) and returns plain tensors and floats from rank 0; the
tests compare them with transformers (eager experts) in the test process and between runs
on one and two ranks.

The batch is :func:`rlweave.testing.scenarios.fixed_batch` (six samples, 76 tokens) with a budget
of 71 tokens per micro-batch: one rank packs samples ``{1..5}`` and ``{0}``, exactly what two
ranks get from :func:`rlweave.testing.scenarios.shard_indices`, so every micro-batch -- and therefore
its load-balancing loss -- is the same on one and two ranks.
"""

from __future__ import annotations

import os

import torch

from rlweave.testing import scenarios as sc

BUDGET = 71
# eps well above the last-bit differences of 1- vs 2-rank gradients: Adam's first step is then
# as exact as the gradients (with eps 1e-8 it is ~sign(g), flipping on tiny noisy entries)
OPTIM = {"lr": 1e-3, "grad_clip": 1.0, "eps": 1e-5}
ROUTERS = ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight")


#: where the real kernel object lives (a plugin of its own: reached by name, as the worker
#: context reaches it, not imported here)
KERNEL_TARGET = "rlweave_kernel_moe.kernel:KERNEL"


class ForcedKernel:
    """The real ``moe_groupgemm`` kernel with its implementation chosen (``impl``) instead of
    picked by device; a kernel object a worker context can point at (``"<this module's
    name>:REFERENCE_KERNEL"``: it resolves in a rank running one of these scenarios)."""

    def __init__(self, impl: str):
        self.impl = impl

    def apply(self, model, device: str) -> dict:
        from rlweave.targets import import_target

        return import_target(KERNEL_TARGET).apply(model, device, impl=self.impl)


REFERENCE_KERNEL = ForcedKernel("reference")
TORCH_KERNEL = ForcedKernel("torch")
TRITON_KERNEL = ForcedKernel("triton")


def _model(path: str) -> dict:
    return {"path": path, "dtype": "float32", "model_type": "causal_lm"}


def _worker(ctx_kw: dict, path: str, kernel: str | None = None, parallel: dict | None = None, **cfg):
    kw = dict(ctx_kw, kernels={"moe_groupgemm": kernel} if kernel else {})
    cfg.setdefault("max_tokens_per_micro_batch", BUDGET)
    return sc.train_worker("fsdp", kw, _model(path), OPTIM, parallel, **cfg)


def full_state(model) -> dict[str, torch.Tensor]:
    """The module's own (stacked) names and full tensors; collective."""
    from torch.distributed.tensor import DTensor

    return {n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone().cpu()
            for n, t in model.state_dict().items()}


def _logprobs(w, shard, idx) -> dict[int, torch.Tensor]:
    lp = w.compute_logprobs(shard)["logprobs"]
    cu = shard.cu_seqlens.tolist()
    return sc.gather_by_sample({i: lp[cu[k] : cu[k + 1]].clone() for k, i in enumerate(idx)})


def _shard(ctx_kw: dict):
    full = sc.fixed_batch()
    idx = sc.shard_indices(ctx_kw["world_size"], ctx_kw["rank"], len(full))
    return full.select(idx), idx


def ranks_scenario(ctx_kw: dict, models: dict[str, str], work: str, coef: float = 0.05) -> dict:
    """Per model (``name -> dir``): packed log-probs and one train step (metrics, gradients,
    updated weights in the module's names) on this many ranks. For the first model also:
    the streamed weights before training, ``save_hf`` after the step, a checkpoint round
    trip (save after the step, a fresh worker loads it; both take one more step) and, on two
    ranks, the error for ``parallel: {sp: 2}``."""
    import torch.distributed as dist

    shard, idx = _shard(ctx_kw)
    res: dict = {}
    for n, (name, path) in enumerate(models.items()):
        w = _worker(ctx_kw, path, moe_aux_loss_coef=coef)
        if n == 0:
            res["streamed0"] = dict(w.named_weights())
        out = {"logprobs": _logprobs(w, shard, idx)}
        out["metrics"], out["grads"] = sc.train_step_with_grads(w, shard, sc.nll_loss)
        out["state"] = full_state(w.model)
        if n == 0:
            res["streamed1"] = dict(w.named_weights())
            w.save_hf(os.path.join(work, "hf"))
            w.save_checkpoint(os.path.join(work, "ckpt"))
            out["next"] = w.train_step(shard, sc.nll_loss)
            out["state_next"] = full_state(w.model)
            r = _worker(ctx_kw, path, moe_aux_loss_coef=coef)
            r.load_checkpoint(os.path.join(work, "ckpt"))
            out["resumed_next"] = r.train_step(shard, sc.nll_loss)
            out["resumed_state_next"] = full_state(r.model)
        res[name] = out
    if ctx_kw["world_size"] == 2:
        res["sp_error"] = sp_refusal_scenario(ctx_kw, next(iter(models.values())))
    dist.barrier()
    return res if ctx_kw["rank"] == 0 else {}


def sp_refusal_scenario(ctx_kw: dict, path: str) -> str:
    """The error a worker raises for an MoE model with ``parallel: {sp: 2}``."""
    try:
        _worker(ctx_kw, path, parallel={"sp": 2})
    except ValueError as exc:
        return str(exc)
    return ""


def variants_scenario(ctx_kw: dict, path: str, kernels: dict[str, str], dense: str | None = None) -> dict:
    """One rank: per variant, log-probs of the fixed batch and one train step (metrics and
    gradients). Variants: ``plain``; ``checkpointed`` (activation checkpointing: recomputed
    routers must not count twice); ``padded`` (right-padded rows: pads are not routed);
    ``dup1``/``dup3`` (three copies of sample 3 in one or in three micro-batches, prompts not
    shared: a prompt carried once is routed once, which changes that forward's loss);
    ``single`` (sample 3 alone, coefficient 1: its aux loss and gradient are transformers');
    ``coef0`` (the loss off); ``default`` (the model config's coefficient); each kernel of
    ``kernels`` (``label -> target``); and ``dense`` (the dense model ``dense`` with the
    ``kernel_auto`` kernel). Each variant also returns the backend's log lines (``logged``)."""
    import logging

    from rlweave.data.batch import Batch

    full = sc.fixed_batch()
    s3 = full.sequences("input_ids")[3].tolist()
    dup = Batch.from_sequences([s3] * 3, prompt_lens=[10] * 3)
    dup.add_token("token_weight", dup.token["loss_mask"] / dup.token["loss_mask"].sum())
    single = full.select([3])
    single.token["token_weight"] = single.token["loss_mask"] / single.token["loss_mask"].sum()
    runs = {
        "plain": ({}, full), "checkpointed": ({"activation_checkpointing": True}, full),
        "padded": ({"use_packing": False}, full),
        "dup1": ({"max_tokens_per_micro_batch": 90, "share_prompts": False}, dup),
        "dup3": ({"max_tokens_per_micro_batch": 30, "share_prompts": False}, dup),
        "single": ({"moe_aux_loss_coef": 1.0}, single),
        "coef0": ({"moe_aux_loss_coef": 0.0}, full), "default": ({"moe_aux_loss_coef": None}, full),
        **{label: ({"kernel": target}, full) for label, target in kernels.items()},
    }
    logger = logging.getLogger("rlweave.backend_fsdp")
    logger.setLevel(logging.INFO)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logger.addHandler(handler)
    res: dict = {}
    for label, (cfg, batch) in runs.items():
        cfg = {"moe_aux_loss_coef": 0.05, **cfg}
        logged.clear()
        w = _worker(ctx_kw, path, **cfg)
        out = {"logprobs": w.compute_logprobs(batch)["logprobs"], "kernel": w.moe_kernel}
        out["metrics"], out["grads"] = sc.train_step_with_grads(w, batch, sc.nll_loss)
        res[label] = {**out, "logged": list(logged)}
    if dense and "kernel_auto" in kernels:
        logged.clear()
        w = _worker(ctx_kw, dense, kernel=kernels["kernel_auto"])
        res["dense"] = {"kernel": w.moe_kernel, "metrics": w.train_step(full, sc.nll_loss), "logged": list(logged)}
    logger.removeHandler(handler)
    return res


def one_rank_scenario(ctx_kw: dict, models: dict[str, str], work: str, coef: float, kernels: dict[str, str],
                      dense: str | None = None) -> dict:
    """:func:`ranks_scenario` and, on the same rank (one spawn), :func:`variants_scenario`
    on the first model: ``{"ranks": ..., "variants": ...}``."""
    first = next(iter(models.values()))
    return {"ranks": ranks_scenario(ctx_kw, models, work, coef),
            "variants": variants_scenario(ctx_kw, first, kernels, dense)}
