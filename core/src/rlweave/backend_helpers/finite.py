"""Non-finite values (NaN, inf) in training state, agreed on by all ranks of a role (any
training backend).

A rank alone cannot act on a non-finite value: skipping an optimizer step or refusing a
checkpoint on one rank while the others go on would desynchronise the shards or hang a
collective. :func:`any_rank` turns a local finding into the same answer on every rank;
:func:`first_nonfinite` finds the first non-finite tensor of a rank's shards (parameters,
then optimizer state) so an error can name it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is True on any rank (one all-reduce; collective:
    every rank must call it). Without an initialised process group: ``flag``."""
    if not (dist.is_available() and dist.is_initialized()):
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor ``t``; any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _named_state(model: torch.nn.Module, optimizer) -> list[tuple[str, torch.Tensor]]:
    params = list(model.named_parameters())
    out = [(f"parameter {n}", local_shard(p.detach())) for n, p in params]
    if optimizer is not None:
        names = {id(p): n for n, p in params}
        for group in optimizer.param_groups:
            for p in group["params"]:
                for k, v in optimizer.state.get(p, {}).items():
                    if torch.is_tensor(v):
                        out.append((f"optimizer state {names.get(id(p), '<unnamed>')} [{k}]", local_shard(v.detach())))
    return [(n, t) for n, t in out if t.is_floating_point() and t.numel()]


@torch.no_grad()
def first_nonfinite(model: torch.nn.Module, optimizer=None) -> str | None:
    """Name of the first tensor of this rank's shards holding a NaN or an inf: parameters in
    ``named_parameters`` order, then optimizer state per parameter (e.g. ``"optimizer state
    model.layers.0.mlp.up_proj.weight [exp_avg_sq]"``); None when all are finite. Local (no
    collective); one max-abs reduction per tensor."""
    named = _named_state(model, optimizer)
    if not named:
        return None
    dev = named[0][1].device
    peaks = torch.stack([torch.linalg.vector_norm(t, float("inf")).float().to(dev) for _, t in named]).cpu()
    bad = (~torch.isfinite(peaks)).nonzero()
    return named[int(bad[0])][0] if bad.numel() else None
