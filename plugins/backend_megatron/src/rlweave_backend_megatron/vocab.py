"""Log-probabilities and entropy from vocabulary-parallel logits, never gathering the vocabulary.

Each tensor-parallel rank holds the logits of a contiguous slice of the (padded) vocabulary,
``[rank * V_local, (rank + 1) * V_local)``. The softmax normaliser and the target's logit are
summed over the tensor-parallel group; every rank then holds the same loss, and the sums'
backward passes each rank's gradient to its own slice, as a full softmax would. Columns at or past ``vocab`` (the
padding of the embedding rows) are excluded, so the result equals a softmax over the real
vocabulary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over ``group``; the backward passes the gradient through unchanged, because every
    rank computes the same loss from the sum (megatron's reduce-from-tensor-parallel region)."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x, group=group)


def logprobs_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab: int, rank: int, group,
                     temperature: float = 1.0, with_entropy: bool = False, chunk: int = 1024,
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``(T, V_local)`` of this rank's vocabulary slice, ``targets`` ``(T,)`` global
    token ids -> ``log p(target)`` and (``with_entropy``) the entropy, ``(T,)`` float32, of
    ``softmax(logits / temperature)`` over the real vocabulary. Computed ``chunk`` rows at a
    time in fp32; every rank of ``group`` must call it with the same ``T``."""
    lps, ents = [], []
    for s in range(0, max(1, logits.shape[0]), chunk):
        lp, ent = _chunk(logits[s:s + chunk], targets[s:s + chunk], vocab, rank, group, temperature, with_entropy)
        lps.append(lp)
        if ent is not None:
            ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def _chunk(logits, targets, vocab, rank, group, temperature, with_entropy):
    n_local = logits.shape[-1]
    lo = rank * n_local
    x = logits.float() / temperature
    if lo + n_local > vocab:  # padded columns never win
        cols = torch.arange(lo, lo + n_local, device=x.device)
        x = x.masked_fill(cols >= vocab, float("-inf"))
    with torch.no_grad():
        m = x.max(dim=-1).values
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    z = x - m.unsqueeze(-1)
    e = torch.exp(z)
    sumexp = _all_reduce(e.sum(-1), group)
    local_t = targets - lo
    inside = (local_t >= 0) & (local_t < n_local)
    picked = torch.gather(z, -1, local_t.clamp(0, n_local - 1).unsqueeze(-1)).squeeze(-1)
    picked = _all_reduce(torch.where(inside, picked, torch.zeros_like(picked)), group)
    log_z = torch.log(sumexp)
    lp = picked - log_z
    if not with_entropy:
        return lp, None
    # H = log Z - E_p[z]; padded columns have e = 0 and z = -inf, so mask the product there
    ez = torch.where(e > 0, e * z, torch.zeros_like(e)).sum(-1)
    ent = log_z - _all_reduce(ez, group) / sumexp
    return lp, ent
