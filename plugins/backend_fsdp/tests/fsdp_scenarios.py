"""Multi-rank scenarios of the FSDP backend, shared by the CPU (gloo) and GPU (NCCL) tests.

Each runs the real ``FSDPWorker`` on every rank (through
:func:`rlweave.testing.ranks.run_ranks`, which loads this file in each rank) and returns plain
tensors/floats from rank 0; the tests compare them with the single-process transformers
references of :mod:`rlweave.testing.scenarios`, re-exported here with the batches the tests
read (``sc.fixed_batch``, ``sc.reference_logprobs``...).
"""

from __future__ import annotations

import os

import torch

from rlweave.testing.scenarios import (  # noqa: F401 - the tests read the batches and references here
    TemperedLogprobSum,
    fixed_batch,
    gather_by_sample,
    group_batch,
    nll_loss,
    reference_grad_norm,
    reference_logprobs,
    shard_indices,
    train_worker,
    value_loss,
)

BACKEND = "fsdp"


def _worker(ctx_kw: dict, model: dict, optim: dict | None, parallel: dict | None = None, **cfg):
    """A built :class:`FSDPWorker` of role ``policy`` (seed 3): backend options ``cfg``,
    ``roles.policy.parallel`` sizes ``parallel``."""
    return train_worker(BACKEND, ctx_kw, model, optim, parallel, **cfg)


def policy_scenario(ctx_kw: dict, model_dir: str, work: str, budget: int = 32) -> dict:
    """Log-probs (packed, padded), streaming, training, DCP resume, HF export, offload."""
    import torch.distributed as dist

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    full = fixed_batch()
    idx = shard_indices(world, rank, len(full))
    shard = full.select(idx)
    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    optim = {"lr": 3e-3, "grad_clip": 1.0, "warmup_steps": 1, "schedule": "cosine", "total_steps": 10}
    res: dict = {}
    a = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=budget)
    res["streamed0"] = dict(a.named_weights())

    def per_sample(x: torch.Tensor) -> dict[int, torch.Tensor]:
        cu = shard.cu_seqlens.tolist()
        return {i: x[cu[k] : cu[k + 1]].clone() for k, i in enumerate(idx)}

    out = a.compute_logprobs(shard, with_entropy=True)
    res["logprobs"] = gather_by_sample(per_sample(out["logprobs"]))
    res["entropy"] = gather_by_sample(per_sample(out["entropy"]))
    a.packing = False
    res["logprobs_padded"] = gather_by_sample(per_sample(a.compute_logprobs(shard)["logprobs"]))
    a.packing = True
    # shared prompts (GRPO groups) against the same samples unshared, forward and one step
    grp = group_batch()
    gidx = shard_indices(world, rank, len(grp))
    gs = grp.select(gidx)

    def per_group_sample(x: torch.Tensor) -> dict[int, torch.Tensor]:
        cu = gs.cu_seqlens.tolist()
        return {i: x[cu[k] : cu[k + 1]].clone() for k, i in enumerate(gidx)}

    for share in (True, False):
        a.cfg.share_prompts = share
        o = a.compute_logprobs(gs, with_entropy=True)
        res[f"group_logprobs_{share}"] = gather_by_sample(per_group_sample(o["logprobs"]))
        res[f"group_entropy_{share}"] = gather_by_sample(per_group_sample(o["entropy"]))
        w = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=budget, share_prompts=share)
        res[f"group_step_{share}"] = [w.train_step(gs, nll_loss) for _ in range(2)]
    a.cfg.share_prompts = True
    # the training forward uses the loss function's temperature, like compute_logprobs
    t = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=budget)
    w_tok = shard.token["token_weight"]
    local = [float((w_tok * t.compute_logprobs(shard, temperature=temp)["logprobs"]).sum()) for temp in (0.5, 1.0)]
    sums: list = [None] * world
    dist.all_gather_object(sums, local)
    res["tempered"] = {"train_wlp": t.train_step(shard, TemperedLogprobSum(0.5))["wlp"],
                       "wlp_t05": sum(x[0] for x in sums), "wlp_t1": sum(x[1] for x in sums)}
    ckpt = os.path.join(work, "ckpt")
    metrics = []
    for step in range(4):
        if step == 2:
            a.save_checkpoint(ckpt)
        metrics.append(a.train_step(shard, nll_loss))
    res["metrics"] = metrics
    res["streamed1"] = dict(a.named_weights())
    res["logprobs_after"] = gather_by_sample(per_sample(a.compute_logprobs(shard)["logprobs"]))
    a.save_hf(os.path.join(work, "hf"))
    off = a.offload()
    on = a.onload()
    res["offload"], res["onload"] = off, on
    res["logprobs_onload"] = gather_by_sample(per_sample(a.compute_logprobs(shard)["logprobs"]))
    b = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=budget)
    b.load_checkpoint(ckpt)
    res["metrics_resumed"] = [b.train_step(shard, nll_loss) for _ in range(2)]
    dist.barrier()
    return res if rank == 0 else {}


def heads_scenario(ctx_kw: dict, model_dir: str, work: str) -> dict:
    """Reward model scores, its export, a critic initialised from it, critic steps; then a
    policy in bf16 mixed precision with activation checkpointing."""
    import torch.distributed as dist
    from rlweave.data.batch import Batch

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    full = fixed_batch()
    idx = shard_indices(world, rank, len(full))
    shard = full.select(idx)
    res: dict = {}
    rm = _worker(ctx_kw, {"path": model_dir, "model_type": "reward"}, None, max_tokens_per_micro_batch=32)
    scores = rm.compute_scores(shard)
    res["scores"] = gather_by_sample({i: scores[k : k + 1] for k, i in enumerate(idx)})
    rm_dir = os.path.join(work, "rm")
    rm.save_hf(rm_dir)
    critic = _worker(ctx_kw, {"path": rm_dir, "model_type": "value"}, {"lr": 1e-2}, max_tokens_per_micro_batch=32)
    # each sample plus one token: the value at that extra position reads the head at the
    # sample's last token, i.e. the reward model's score
    ext = Batch.from_sequences([s.tolist() + [7] for s in shard.sequences("input_ids")])
    vals = critic.compute_values(ext)
    last = ext.cu_seqlens[1:] - 1
    res["critic_last"] = gather_by_sample({i: vals[last[k] : last[k] + 1] for k, i in enumerate(idx)})
    # scores and values with shared prompts against the same samples unshared
    gidx = shard_indices(world, rank, 9)
    gs = group_batch().select(gidx)
    gcu = gs.cu_seqlens.tolist()
    for share in (True, False):
        rm.cfg.share_prompts = critic.cfg.share_prompts = share
        sc = rm.compute_scores(gs)
        res[f"group_scores_{share}"] = gather_by_sample({i: sc[k : k + 1] for k, i in enumerate(gidx)})
        v = critic.compute_values(gs)
        res[f"group_values_{share}"] = gather_by_sample({i: v[gcu[k] : gcu[k + 1]] for k, i in enumerate(gidx)})
    critic.cfg.share_prompts = True
    res["critic_metrics"] = [critic.train_step(shard, value_loss) for _ in range(3)]
    critic.save_hf(os.path.join(work, "critic"))
    # bf16 mixed precision + activation checkpointing on the policy
    pol = _worker(ctx_kw, {"path": model_dir}, {"lr": 3e-3}, max_tokens_per_micro_batch=32,
                  mixed_precision="bf16", activation_checkpointing=True)
    lp = pol.compute_logprobs(shard)["logprobs"]
    cu = shard.cu_seqlens.tolist()
    res["bf16_logprobs"] = gather_by_sample({i: lp[cu[k] : cu[k + 1]] for k, i in enumerate(idx)})
    res["bf16_metrics"] = [pol.train_step(shard, nll_loss) for _ in range(3)]
    res["bf16_param_dtype"] = str(next(iter(pol.model.parameters())).dtype)
    dist.barrier()
    return res if rank == 0 else {}


def _compiled_run(ctx_kw: dict, model: dict, optim: dict, **cfg) -> dict:
    """One worker built with ``cfg`` (compile options): log-probs of a packed and of a
    shared-prompt batch (two micro-batch shapes each, so the dynamic graph is reused), then
    three training steps from the same weights; ``compiled`` names the compiled modules in
    its decoder layers, ``graphs`` counts the graphs dynamo made while it ran (the counter is
    per process: the runs before it compiled their own)."""
    from torch._dynamo.utils import counters

    from rlweave.backend_helpers.hf_model.modeling import decoder_layers

    before = int(counters["stats"]["unique_graphs"])
    w = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=32, **cfg)
    out = {f"lp_{name}": w.compute_logprobs(b)["logprobs"] for name, b in
           (("packed", fixed_batch()), ("shared", group_batch()))}
    out["losses"] = [w.train_step(b, nll_loss)["nll"] for b in (fixed_batch(), group_batch(), fixed_batch())]
    out["compiled"] = sorted(type(m).__name__.removeprefix("FSDP")  # FSDP2 renames the classes it wraps
                             for layer in decoder_layers(w.model) for m in layer.modules()
                             if getattr(m, "_compiled_call_impl", None) is not None)
    out["graphs"] = int(counters["stats"]["unique_graphs"]) - before
    return out


def compile_scenario(ctx_kw: dict, model_dir: str, work: str, scope: str = "auto") -> dict:
    """The same model eager (``False``) and with ``compile: true`` (``True``, ``compile_scope``),
    each a :func:`_compiled_run`."""
    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    optim = {"lr": 3e-3, "grad_clip": 1.0}
    return {compiled: _compiled_run(ctx_kw, model, optim, compile=compiled, compile_scope=scope)
            for compiled in (False, True)}


def shared_prompt_attention(dtype: str, backward: str) -> dict:
    """Attention over one row carrying each group's prompt once (mixed prompt and response
    lengths, a group of one, an empty response; ``rlweave.backend_helpers.hf_model.prefix.share``) beside
    causal attention of every sample on its own, with the same leaves and output weights:
    ``row`` (the shared row), ``got``/``ref`` (outputs per original token, fp32) and
    ``grads``/``ref_grads`` (q, k, v gradients, fp32). ``backward`` is the CPU attention backward
    (``fp32``, or ``bf16``: the compiled bf16 one with bf16 inputs)."""
    import torch.nn.functional as F

    from rlweave.backend_helpers.hf_model.attention import planned_sdpa
    from rlweave.backend_helpers.hf_model.cpu.attention import Modes
    from rlweave.backend_helpers.hf_model.prefix import share

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    prompts = {0: [5, 6, 7], 1: [8, 9], 2: [4, 4, 4, 4]}
    samples = [(0, [1, 2, 3]), (1, [3]), (0, [2, 2, 2]), (0, [9]), (2, [1, 1]), (1, [7, 7, 7, 7]), (1, [])]
    seqs = [prompts[p] + r for p, r in samples]
    plens = [len(prompts[p]) for p, _ in samples]
    cu = torch.tensor([0] + [sum(len(x) for x in seqs[: i + 1]) for i in range(len(seqs))])
    ids = torch.tensor([t for x in seqs for t in x])
    row = share(ids, cu, plens)
    t = row.input_ids.numel()
    q = torch.randn(1, 4, t, 8, dtype=dt, requires_grad=True)
    k = torch.randn(1, 2, t, 8, dtype=dt, requires_grad=True)
    v = torch.randn(1, 2, t, 8, dtype=dt, requires_grad=True)
    w = torch.randn(1, ids.numel(), 4, 8)

    got = planned_sdpa(q, k, v, row.plan, None, 0.0, True, Modes(backward=backward))[:, row.tok_row]
    (got.float() * w).sum().backward()
    grads = [x.grad.float().clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    qu, ku, vu = (x[:, :, row.tok_row] for x in (q, k, v))  # the unshared row, same leaves
    ref = torch.cat([
        F.scaled_dot_product_attention(qu[:, :, s:e], ku[:, :, s:e], vu[:, :, s:e], is_causal=True, enable_gqa=True)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())
    ], dim=2).transpose(1, 2)
    (ref.float() * w).sum().backward()
    return {"row": row, "ids": ids, "got": got.detach().float(), "ref": ref.detach().float(), "grads": grads,
            "ref_grads": [x.grad.float() for x in (q, k, v)]}


def shared_prompt_attention_close(case: dict, dtype: str) -> bool:
    """Whether :func:`shared_prompt_attention`'s outputs and gradients agree: to fp32 rounding,
    or in bf16 within the sums of several bf16 gradients."""
    tol, rtol = (1e-5, 0) if dtype == "float32" else (3e-2, 2e-2)
    pairs = [(case["got"], case["ref"]), *zip(case["grads"], case["ref_grads"])]
    return all(torch.allclose(a, b, atol=tol, rtol=rtol) for a, b in pairs)


def compiled_cpu_scenario(ctx_kw: dict, model_dir: str, work: str, scopes: list[str], bf16_ratio: str) -> dict:
    """Every compiled run of the CPU tests in one process, so the spawn, inductor's start-up
    and the compiled log-prob kernels of the fp32 runs are paid once: the model eager
    (``"eager"``), then with ``compile: true`` at each of ``scopes`` (``"auto"``, ``"layer"``...),
    each a :func:`_compiled_run` in fp32; then bf16 compute with ``compile: true`` on a CPU whose
    bf16 speed is ``bf16_ratio`` (``RLWEAVE_CPU_BF16_RATIO``, set for these two workers only)
    and the attention backward chosen by ``cpu.attention_backward`` (``"bf16_fp32"``: ``fp32``;
    ``"bf16_auto"``: ``auto``, which resolves to the compiled bf16 one): the backward each
    worker set for its attention modules (``marks``) and the losses of three training steps
    from the same weights (packed and shared-prompt rows); then whether that compiled backward gives
    :func:`shared_prompt_attention`'s reference outputs and gradients (``"bf16_shared_prompt_close"``),
    and how many graphs dynamo holds for that backward after all of them (``"bf16_backward_graphs"``)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from rlweave.devices.cpu import ENV
    from rlweave.backend_helpers.hf_model.cpu.attention import _bf16_backward_math, modes_of
    from rlweave.backend_helpers.hf_model.modeling import decoder_layers

    model = {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}
    optim = {"lr": 3e-3, "grad_clip": 1.0}
    res = {"eager": _compiled_run(ctx_kw, model, optim, compile=False)}
    for scope in scopes:
        res[scope] = _compiled_run(ctx_kw, model, optim, compile=True, compile_scope=scope)
    # the bf16 runs could reuse none of dynamo's fp32 graphs (other dtypes): they start from fresh
    # dynamo caches and recompile counts, as in a process of their own (inductor's caches stay)
    torch._dynamo.reset()
    old = os.environ.get(ENV)
    os.environ[ENV] = bf16_ratio
    try:
        for kind in ("fp32", "auto"):
            w = _worker(ctx_kw, model, optim, max_tokens_per_micro_batch=32, compile=True, mixed_precision="bf16",
                        cpu={"attention_backward": kind})
            res[f"bf16_{kind}"] = {
                "marks": [modes_of(layer.self_attn).backward for layer in decoder_layers(w.model)],
                "losses": [w.train_step(b, nll_loss)["nll"] for b in (fixed_batch(), group_batch(), fixed_batch())],
            }
        # the compiled bf16 backward on masked shared-prompt buckets against per-sample attention, in the process
        # (and inductor session) that compiled it for training
        res["bf16_shared_prompt_close"] = shared_prompt_attention_close(shared_prompt_attention("bfloat16", "bf16"),
                                                                        "bfloat16")
        res["bf16_backward_graphs"] = len(_debug_get_cache_entry_list(_bf16_backward_math.__code__))
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
    return res


def cpu_choices_scenario(ctx_kw: dict, model_dir: str, work: str, ratios: list[float]) -> dict:
    """bf16 mixed precision on CPU with rank ``r``'s bf16 speed set to ``ratios[r]``
    (``RLWEAVE_CPU_BF16_RATIO``): the speed every rank resolved with, the warnings logged,
    the CPU attention modes of the attention modules, whether rlweave's CPU linears were installed, and
    the losses of two training steps."""
    import logging

    import torch.distributed as dist

    from rlweave.devices.cpu import ENV
    from rlweave.backend_helpers.hf_model.cpu.attention import modes_of
    from rlweave.backend_helpers.hf_model.modeling import decoder_layers

    os.environ[ENV] = str(ratios[ctx_kw["rank"]])
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("rlweave.backend_fsdp").addHandler(handler)
    w = _worker(ctx_kw, {"path": model_dir, "dtype": "float32", "model_type": "causal_lm"}, {"lr": 3e-3},
                max_tokens_per_micro_batch=32, mixed_precision="bf16")
    layers = decoder_layers(w.model)
    shard = fixed_batch().select(shard_indices(ctx_kw["world_size"], ctx_kw["rank"], 6))
    local = {"ratio": w.choices.speed.ratio, "logged": logged,
             "marks": [(modes_of(layer.self_attn).forward, modes_of(layer.self_attn).backward) for layer in layers],
             "kernels": ["forward" in layer.mlp.gate_proj.__dict__ for layer in layers],
             "losses": [w.train_step(shard, nll_loss)["loss"] for _ in range(2)]}
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, local)
    return {"ranks": out}
