"""Loss aggregations: how per-token losses of a mini-batch become one number.

An aggregation returns the token weights ``w`` ``(T,)`` of :mod:`rlweave.interfaces.backend`'s
convention, so that ``sum_t w_t * loss_t`` over the whole mini-batch (all micro-batches, all
ranks) is the loss wanted; backends only ever sum. ``mask`` marks the trained tokens, ``n`` is
the number of samples, ``L_i`` sample ``i``'s trained tokens, ``n_valid`` the samples with at
least one; a mini-batch with no trained token gets all-zero weights.

==========================  ==========================  =========================================
name                        loss                        weights
==========================  ==========================  =========================================
token_mean                  mean over all tokens        ``mask / sum(mask)`` (DAPO)
seq_mean_token_mean         mean of per-sample means    ``mask / (L_i * n_valid)`` (GRPO, GSPO)
seq_mean_token_sum          mean of per-sample sums     ``mask / n_valid``
seq_mean_token_sum_norm     sums over a constant        ``mask / (n * max_len)`` (Dr.GRPO)
token_sum                   sum over all tokens         ``mask``
==========================  ==========================  =========================================

``max_len`` (``seq_mean_token_sum_norm``) is the longest response the run samples
(``algorithm.max_new_tokens``) unless the aggregation's ``norm_len`` option sets it.
"""

from __future__ import annotations

import torch

from rlweave.algo_parts.advantages import sample_of_token


def _per_sample(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    smp = sample_of_token(cu_seqlens)
    m = mask.to(torch.float64)
    per = torch.zeros(cu_seqlens.numel() - 1, dtype=torch.float64).index_add_(0, smp, m)
    return smp, per, int((per > 0).sum())


def token_mean(mask, cu_seqlens=None, **_):
    """Every trained token of the mini-batch counts the same."""
    m = mask.to(torch.float32)
    total = m.sum()
    return m / total if total > 0 else torch.zeros_like(m)


def seq_mean_token_mean(mask, cu_seqlens, **_):
    """Mean over the tokens of each sample, then mean over the samples (original GRPO)."""
    smp, per, n_valid = _per_sample(mask, cu_seqlens)
    if n_valid == 0:
        return torch.zeros_like(mask, dtype=torch.float32)
    return (mask.to(torch.float64) / (per.clamp(min=1.0) * n_valid)[smp]).to(torch.float32)


def seq_mean_token_sum(mask, cu_seqlens, **_):
    """Sum over the tokens of each sample, then mean over the samples."""
    _, _, n_valid = _per_sample(mask, cu_seqlens)
    if n_valid == 0:
        return torch.zeros_like(mask, dtype=torch.float32)
    return mask.to(torch.float32) / n_valid


def seq_mean_token_sum_norm(mask, cu_seqlens, *, max_len: int | None = None, norm_len: int | None = None, **_):
    """Sum over each sample's tokens divided by a constant length, then mean over all samples
    (Dr.GRPO: no bias towards short or long responses)."""
    length = norm_len or max_len
    if not length:
        raise ValueError("loss aggregation 'seq_mean_token_sum_norm' needs a normalising length: the algorithm's "
                         "max_new_tokens, or the option norm_len")
    n = cu_seqlens.numel() - 1
    if n == 0 or not bool((mask > 0).any()):
        return torch.zeros_like(mask, dtype=torch.float32)
    return mask.to(torch.float32) / (n * float(length))


def token_sum(mask, cu_seqlens=None, **_):
    """The plain sum of the per-token losses."""
    return mask.to(torch.float32).clone()
