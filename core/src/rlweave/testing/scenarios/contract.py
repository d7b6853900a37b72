"""The rank side of :class:`rlweave.testing.backend_contract.BackendContractSuite`: two
scenarios run by :func:`rlweave.testing.ranks.run_ranks` that drive a backend's worker through
the whole worker contract and return plain data (floats, tensors on CPU) from rank 0.

Both take ``spec``, a plain dict: ``backend`` (its record name), ``model_dir`` (a causal LM),
``heads_dir`` (the same weights with a ``score.weight`` head, :func:`build_heads_model`),
``work`` (a folder for the checkpoint, ``work/ckpt``, and the HF export, ``work/hf``),
``options``, ``parallel`` and ``optim`` (the role's sections) and ``kinds`` (the model types to
check). Each data-parallel block of ranks gets :func:`~.batches.shard_indices` of its block
index, as the scheduler's dispatch would give it a shard (uneven on purpose).

Importing this module is light (torch is imported when a scenario runs).
"""

from __future__ import annotations

import os
from typing import Any

from rlweave.testing.scenarios.batches import fixed_batch, gather_by_sample, shard_indices
from rlweave.testing.scenarios.losses import NaNOnRank, nll_loss, value_loss
from rlweave.testing.scenarios.workers import train_worker

#: the batch of the step after the checkpoint (the first step trains on ``fixed_batch()``)
NEXT_SEED = 4
#: samples in ``fixed_batch()``
N_SAMPLES = 6


def build_heads_model(model_dir: str, out: str, seed: int = 1) -> str:
    """Copy of the HF directory ``model_dir`` without ``lm_head.weight`` and with a one-label
    ``score.weight`` drawn with ``seed``: a value or reward model whose head is in the files (no
    backend initialises it), readable by transformers' classification models. Returns ``out``."""
    import shutil
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    tensors = load_file(str(Path(out) / "model.safetensors"))
    tensors.pop("lm_head.weight", None)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    tensors["score.weight"] = torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed)) * 0.3
    save_file(tensors, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    return out


def block_shard(ctx_kw: dict, parallel: dict, n: int) -> list[int]:
    """The samples of an ``n``-sample batch this rank's data-parallel block gets (blocks of
    ``world_size // dp`` consecutive ranks, :mod:`rlweave.scheduler.dispatch`)."""
    from rlweave.scheduler.dispatch import dp_size

    world = ctx_kw["world_size"]
    dp = dp_size(world, parallel)
    return shard_indices(dp, ctx_kw["rank"] // (world // dp), n)


def _per_sample(batch, idx: list[int], x) -> dict[int, Any]:
    """``{sample index: its slice of the per-token tensor x}`` of a shard (indices ``idx``)."""
    cu = batch.cu_seqlens.tolist()
    return {i: x[cu[k]:cu[k + 1]].detach().cpu().clone() for k, i in enumerate(idx)}


def _weights(w) -> dict[str, Any]:
    """What ``named_weights()`` streams (rank 0; empty elsewhere), in its order."""
    return {n: t.detach().cpu().clone() for n, t in w.named_weights()}


def _everyone(x: Any) -> list[Any]:
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


def _worker(ctx_kw: dict, spec: dict, kind: str, path: str, optim: dict | None):
    model = {"path": path, "dtype": "float32", "model_type": kind}
    return train_worker(spec["backend"], ctx_kw, model, optim, spec["parallel"], **spec["options"])


def _policy(ctx_kw: dict, spec: dict) -> tuple[Any, dict[str, Any]]:
    """The causal LM through every operation, in this order: log-probs and entropy, one step,
    checkpoint, log-probs, HF export, offload/onload, the next step, a step with a NaN loss on
    the last rank, a normal step."""
    full, idx = fixed_batch(), block_shard(ctx_kw, spec["parallel"], N_SAMPLES)
    shard, nxt = full.select(idx), fixed_batch(seed=NEXT_SEED).select(idx)
    w = _worker(ctx_kw, spec, "causal_lm", spec["model_dir"], spec["optim"])
    res: dict[str, Any] = {}
    out = w.compute_logprobs(shard, with_entropy=True)
    res["logprobs"] = gather_by_sample(_per_sample(shard, idx, out["logprobs"]))
    res["entropy"] = gather_by_sample(_per_sample(shard, idx, out["entropy"]))
    res["streamed0"] = _weights(w)
    res["step"] = w.train_step(shard, nll_loss)
    res["streamed1"] = _weights(w)
    w.save_checkpoint(os.path.join(spec["work"], "ckpt"))
    res["logprobs1"] = gather_by_sample(_per_sample(shard, idx, w.compute_logprobs(shard)["logprobs"]))
    w.save_hf(os.path.join(spec["work"], "hf"))
    res["offload"] = _everyone(w.offload())
    res["onload"] = _everyone(w.onload())
    res["logprobs_onload"] = gather_by_sample(_per_sample(shard, idx, w.compute_logprobs(shard)["logprobs"]))
    res["next_step"] = w.train_step(nxt, nll_loss)
    res["streamed2"] = _weights(w)
    res["nan_step"] = _everyone(w.train_step(shard, NaNOnRank(ctx_kw["world_size"] - 1)))
    res["streamed_nan"] = _weights(w)
    res["after_nan_step"] = w.train_step(shard, nll_loss)
    res["streamed_after_nan"] = _weights(w)
    return w, res


def _head(ctx_kw: dict, spec: dict, kind: str) -> tuple[Any, dict[str, Any]]:
    """A reward model's scores, or a value model's values and one step of :func:`value_loss`
    with the weights streamed before and after it."""
    idx = block_shard(ctx_kw, spec["parallel"], N_SAMPLES)
    shard = fixed_batch().select(idx)
    w = _worker(ctx_kw, spec, kind, spec["heads_dir"], spec["optim"] if kind == "value" else None)
    if kind == "reward":
        scores = w.compute_scores(shard)
        return w, {"scores": gather_by_sample({i: scores[k].detach().cpu().clone() for k, i in enumerate(idx)})}
    res: dict[str, Any] = {"values": gather_by_sample(_per_sample(shard, idx, w.compute_values(shard)))}
    res["streamed0"] = _weights(w)
    res["step"] = w.train_step(shard, value_loss)
    res["streamed1"] = _weights(w)
    return w, res


def contract_scenario(ctx_kw: dict, spec: dict) -> dict[str, Any]:
    """Everything the suite checks at its ``world_size`` (see the module docstring), one
    worker per model type in ``spec['kinds']``; rank 0's results by model type."""
    import torch.distributed as dist

    res: dict[str, Any] = {}
    w = None
    if "causal_lm" in spec["kinds"]:
        w, res["causal_lm"] = _policy(ctx_kw, spec)
    for kind in ("reward", "value"):
        if kind in spec["kinds"]:
            w, res[kind] = _head(ctx_kw, spec, kind)
    dist.barrier()
    if w is not None:
        w.shutdown()
    return res if ctx_kw["rank"] == 0 else {}


def reload_scenario(ctx_kw: dict, spec: dict) -> dict[str, Any]:
    """The checkpoint :func:`contract_scenario` wrote, loaded on this scenario's ranks: the
    weights streamed after loading, then the next step and the weights after it."""
    import torch.distributed as dist

    idx = block_shard(ctx_kw, spec["parallel"], N_SAMPLES)
    w = _worker(ctx_kw, spec, "causal_lm", spec["model_dir"], spec["optim"])
    w.load_checkpoint(os.path.join(spec["work"], "ckpt"))
    res = {"loaded": _weights(w), "next_step": w.train_step(fixed_batch(seed=NEXT_SEED).select(idx), nll_loss)}
    res["streamed2"] = _weights(w)
    dist.barrier()
    w.shutdown()
    return res if ctx_kw["rank"] == 0 else {}
