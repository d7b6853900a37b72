"""A two-rank scenario for the vocabulary-parallel log-probs tests (each rank loads this file
again, see :func:`rlweave.testing.ranks.run_ranks`).

:func:`vocab_parallel_scenario` runs on every rank of a tensor-parallel group of megatron-core
(gloo on CPU, the CPU redirections applied): each rank holds its slice of the columns of the
same padded logits, computes :func:`rlweave_backend_megatron.vocab.logprobs_entropy` on it and
back-propagates the log-probs and the entropy separately; rank 0 returns every rank's results.
"""

from __future__ import annotations

from typing import Any

import torch


def case_tensors(t: int, padded: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits ``(t, padded)`` whose padding columns hold large values, real-vocabulary targets
    and per-token entropy weights, the same on every rank for one ``seed``."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, padded, generator=g) * 3.0
    logits[:, vocab:] = 50.0  # would dominate a softmax that did not exclude padding
    targets = torch.randint(0, vocab, (t,), generator=g)
    weights = torch.rand(t, generator=g)
    return logits, targets, weights


def vocab_parallel_scenario(ctx_kw: dict, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each case ``{t, padded, vocab, seed, temperature, chunk}`` the log-probs, the entropy
    and this rank's gradients of ``sum(lp)`` and ``sum(w * entropy)`` w.r.t. its logits slice,
    per rank (gathered to rank 0)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rlweave_backend_megatron import cpu_shim, vocab

    rank, world = ctx_kw["rank"], ctx_kw["world_size"]
    cpu_shim.apply()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ctx_kw['master_port']}", rank=rank,
                            world_size=world)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=world)
        group = ps.get_tensor_model_parallel_group()
        tp_rank = ps.get_tensor_model_parallel_rank()
        out = []
        for c in cases:
            logits, targets, weights = case_tensors(c["t"], c["padded"], c["vocab"], c["seed"])
            n = c["padded"] // world
            res: dict[str, Any] = {"rank": tp_rank}
            for what in ("lp", "ent"):
                local = logits[:, tp_rank * n:(tp_rank + 1) * n].clone().requires_grad_(True)
                lp, ent = vocab.logprobs_entropy(local, targets, c["vocab"], tp_rank, group, c["temperature"],
                                                 with_entropy=True, chunk=c["chunk"])
                loss = lp.sum() if what == "lp" else (weights * ent).sum()
                loss.backward()
                res[what] = (lp if what == "lp" else ent).detach()
                res["grad_" + what] = local.grad
            out.append(res)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, out)
        return gathered
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        dist.destroy_process_group()
        cpu_shim.restore()
