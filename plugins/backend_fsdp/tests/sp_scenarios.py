"""Sequence-parallel scenarios of the FSDP backend for the CPU tests (each rank loads this file
again, see :func:`rlweave.testing.ranks.run_ranks`).

:func:`sp_scenario` runs the real ``FSDPWorker`` with ``parallel: {sp: N}`` (or without,
``N = 1``) on every rank, every rank getting the whole batch (one sequence-parallel group), and
returns from rank 0 what the tests compare between ``N = 1`` and ``N = 2``: per-sample outputs
and the full gradient of one train step. :func:`dp_sp_scenario` does the same with two
data-parallel groups.
"""

from __future__ import annotations

import torch

from rlweave.testing import scenarios as sc


def batch_named(name: str):
    """``fixed``: six samples of skewed lengths; ``groups``: GRPO-style prompt groups;
    ``odd``: three samples whose lengths sum to an odd count (the row needs padding)."""
    from rlweave.data.batch import Batch

    if name == "fixed":
        return sc.fixed_batch()
    if name == "groups":
        return sc.group_batch()
    if name == "odd":
        g = torch.Generator().manual_seed(7)
        seqs = [torch.randint(2, 128, (n,), generator=g).tolist() for n in (7, 12, 4)]
        b = Batch.from_sequences(seqs, prompt_lens=[3, 5, 2])
        b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
        return b
    raise ValueError(f"unknown batch {name!r}")


def _per_sample(batch, flat: torch.Tensor) -> dict[int, torch.Tensor]:
    cu = batch.cu_seqlens.tolist()
    return {i: flat[cu[i] : cu[i + 1]].clone() for i in range(len(batch))}


def sp_case(ctx_kw: dict, sp: int, model_dir: str, kind: str = "causal_lm", batch: str = "fixed",
            budget: int = 4096, share_prompts: bool = True, activation_checkpointing: bool = False) -> dict:
    """Outputs and one train step's gradients (before the optimizer applies them) of a
    ``kind`` model at ``parallel.sp = sp``; every rank gets the whole batch ``batch``."""
    model = {"path": model_dir, "dtype": "float32", "model_type": kind}
    options = {"max_tokens_per_micro_batch": budget, "max_tokens_per_forward": budget,
               "share_prompts": share_prompts, "activation_checkpointing": activation_checkpointing}
    w = sc.train_worker("fsdp", ctx_kw, model, {"lr": 1e-3, "grad_clip": 0.0}, {"sp": sp} if sp > 1 else {},
                        **options)
    b = batch_named(batch)
    res: dict = {}
    if kind == "causal_lm":
        out = w.compute_logprobs(b, with_entropy=True)
        res["logprobs"] = _per_sample(b, out["logprobs"])
        res["entropy"] = _per_sample(b, out["entropy"])
        loss = sc.nll_loss
    elif kind == "value":
        res["values"] = _per_sample(b, w.compute_values(b))
        loss = sc.value_loss
    else:
        res["scores"] = w.compute_scores(b)
        return res
    res["metrics"], res["grads"] = sc.train_step_with_grads(w, b, loss)
    return res


def sp_scenario(ctx_kw: dict, sp: int, cases: list[dict]) -> list[dict]:
    """:func:`sp_case` for each keyword dict of ``cases``, in one set of processes."""
    return [sp_case(ctx_kw, sp, **case) for case in cases]


def dp_sp_scenario(ctx_kw: dict, sp: int, model_dir: str) -> dict:
    """Two data-parallel groups of ``sp`` ranks each (``parallel: {dp: 2, sp: sp}``, ``2 * sp``
    ranks): group 0 gets samples 0, 2, 4 of the fixed batch, group 1 samples 1, 3, 5, as the
    dispatcher would hand out blocks. Returns log-probs by sample index (all groups) and one
    train step's full gradients."""
    import torch.distributed as dist

    parallel = {"dp": 2, "sp": sp} if sp > 1 else {"dp": 2}
    w = sc.train_worker("fsdp", ctx_kw, {"path": model_dir, "dtype": "float32"}, {"lr": 1e-3, "grad_clip": 0.0},
                        parallel, max_tokens_per_micro_batch=32)
    full = batch_named("fixed")
    idx = [0, 2, 4] if ctx_kw["rank"] // sp == 0 else [1, 3, 5]
    shard = full.select(idx)
    lp = _per_sample(shard, w.compute_logprobs(shard)["logprobs"])
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {i: lp[j] for j, i in enumerate(idx)})
    metrics, grads = sc.train_step_with_grads(w, shard, sc.nll_loss)
    merged = {i: v for d in gathered for i, v in d.items()}
    return {"logprobs": merged, "grads": grads, "metrics": metrics}
