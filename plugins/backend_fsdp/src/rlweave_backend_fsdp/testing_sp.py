"""Sequence-parallel scenario shared by the CPU tests and ``bench/sequence_parallel.py``.

It lives in the package because spawned ranks import it by name. :func:`sp_scenario` runs the
real :class:`FSDPWorker` with ``parallel: {sp: N}`` (or without, ``N = 1``) on every rank, every
rank getting the whole batch (one sequence-parallel group), and returns from rank 0 what the
tests compare between ``N = 1`` and ``N = 2``: per-sample outputs and the full gradient of one
train step.
"""

from __future__ import annotations

import torch

from rlweave_backend_fsdp import testing_scenarios as sc


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
    w = sc._worker(ctx_kw, model, {"lr": 1e-3, "grad_clip": 0.0}, {"sp": sp} if sp > 1 else {}, **options)
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


def _rss_mib() -> tuple[float, float]:
    """``(current, peak since the last reset)`` resident memory of this process in MiB (Linux)."""
    vals = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # "5": reset the peak resident set size
        fh.write("5")


class SavedActivations:
    """Bytes of the distinct non-parameter tensors autograd saves for backward while active
    (a context manager around forwards): the activation memory of a step, independent of the
    allocator. ``peak`` is the largest total seen across the forwards run inside."""

    def __init__(self) -> None:
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):  # parameters are not activations
            st = t.untyped_storage()
            self._seen[st.data_ptr()] = st.nbytes()
            self.peak = max(self.peak, sum(self._seen.values()))
        return t

    def reset(self) -> None:
        """Forget the tensors of the last forward (call between micro-batches' forwards)."""
        self._seen.clear()

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def bench_case(ctx_kw: dict, sp: int, model_dir: str, tokens: int, steps: int,
               activation_checkpointing: bool = False) -> dict:
    """Train steps on one ``tokens``-long sample at ``parallel.sp = sp`` (after one warm-up
    step on a short sample). Returns ``step_s`` (median), ``peak_mib``: the largest rise of
    any rank's memory over its level before the timed steps (CUDA: allocated bytes; CPU: the
    process's resident set), and ``saved_mib``: the largest activation memory of any rank
    (:class:`SavedActivations`, one more step)."""
    import statistics
    import time

    import torch.distributed as dist

    from rlweave.data.batch import Batch

    def sample(n: int, seed: int) -> Batch:
        g = torch.Generator().manual_seed(seed)
        b = Batch.from_sequences([torch.randint(2, 1000, (n,), generator=g).tolist()], prompt_lens=[16])
        b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
        return b

    options = {"max_tokens_per_micro_batch": tokens, "activation_checkpointing": activation_checkpointing}
    w = sc._worker(ctx_kw, {"path": model_dir, "dtype": "float32"}, {"lr": 1e-5}, {"sp": sp} if sp > 1 else {},
                   **options)
    w.train_step(sample(256, 0), sc.nll_loss)
    cuda = w.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        import gc

        gc.collect()
        base = _rss_mib()[0]
        _reset_peak()
    times = []
    batch = sample(tokens, 1)
    for _ in range(steps):
        t0 = time.perf_counter()
        w.train_step(batch, sc.nll_loss)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else _rss_mib()[1]) - base
    with SavedActivations() as saved:  # one more step, counting what the forward keeps for backward
        w.train_step(batch, sc.nll_loss)
    peaks: list = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, (peak, saved.peak / 2**20))
    return {"step_s": statistics.median(times), "peak_mib": max(p for p, _ in peaks),
            "saved_mib": max(s for _, s in peaks)}


def dp_sp_scenario(ctx_kw: dict, sp: int, model_dir: str) -> dict:
    """Two data-parallel groups of ``sp`` ranks each (``parallel: {dp: 2, sp: sp}``, ``2 * sp``
    ranks): group 0 gets samples 0, 2, 4 of the fixed batch, group 1 samples 1, 3, 5, as the
    dispatcher would hand out blocks. Returns log-probs by sample index (all groups) and one
    train step's full gradients."""
    import torch.distributed as dist

    parallel = {"dp": 2, "sp": sp} if sp > 1 else {"dp": 2}
    w = sc._worker(ctx_kw, {"path": model_dir, "dtype": "float32"}, {"lr": 1e-3, "grad_clip": 0.0}, parallel,
                   max_tokens_per_micro_batch=32)
    full = batch_named("fixed")
    idx = [0, 2, 4] if ctx_kw["rank"] // sp == 0 else [1, 3, 5]
    shard = full.select(idx)
    lp = _per_sample(shard, w.compute_logprobs(shard)["logprobs"])
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {i: lp[j] for j, i in enumerate(idx)})
    metrics, grads = sc.train_step_with_grads(w, shard, sc.nll_loss)
    merged = {i: v for d in gathered for i, v in d.items()}
    return {"logprobs": merged, "grads": grads, "metrics": metrics}
