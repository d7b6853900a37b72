"""Policy losses: the per-token surrogate a policy update minimises.

Each loss is ``fn(logp, old_logp, advantages, *, mask, cu_seqlens, **options) -> (loss_t,
info)``, all ``(T,)`` over a packed micro-batch: ``logp`` the policy's log-probs (with grad),
``old_logp`` those of the policy that sampled or last updated (detached; equal to ``logp``
with one update per batch, giving ratio 1), ``advantages`` per token, ``mask`` the trained
tokens. ``info`` holds ``clipped`` (0/1, where the clip cut the gradient) and ``ratio`` (the
importance ratio the loss used) for the metrics. The caller aggregates ``loss_t`` with the
token weights of a loss aggregation (:mod:`rlweave.algo_parts.aggregation`) and may multiply
it by an off-policy correction first (:mod:`rlweave.algo_parts.offpolicy`).
"""

from __future__ import annotations

import torch

from rlweave.algo_parts.advantages import sample_of_token

#: log-ratios are clamped to +-20 before ``exp`` so a diverged token cannot produce inf
LOG_RATIO_CLAMP = 20.0


def ppo_clip(logp, old_logp, advantages, *, mask=None, cu_seqlens=None, clip_low: float = 0.2,
             clip_high: float = 0.2, dual_clip: float | None = None, **_):
    """PPO's clipped surrogate (Schulman et al. 2017) with separate clip ranges (DAPO's
    clip-higher, Yu et al. 2025) and optional dual clip (Ye et al. 2020)::

        r_t    = exp(logp_t - old_logp_t)
        loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
        dual:    loss_t = min(loss_t, -A_t * dual_clip)   where A_t < 0   (dual_clip > 1)

    The dual clip bounds the loss of a negative-advantage token whose ratio has grown large."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    cut = clipped > unclipped
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
        cut = cut | dual
    return loss, {"clipped": cut.to(logp.dtype), "ratio": ratio.detach()}


def gspo(logp, old_logp, advantages, *, mask, cu_seqlens, clip_low: float = 3e-4, clip_high: float = 4e-4, **_):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio of a
    whole response is the geometric mean of its token ratios,
    ``s_i = exp(mean_{t in i} (logp_t - old_logp_t))``, clipped at the sequence level with its
    own (small) range. Token form (GSPO-token): ``r_t = sg(s_i) * exp(logp_t - sg(logp_t))``, equal
    to ``s_i`` in value with the gradient ``s_i * grad logp_t``::

        loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))

    With a sequence mean of tokens (``seq_mean_token_mean``, its default aggregation) this is
    the paper's objective."""
    on = (mask > 0).to(logp.dtype)
    smp = sample_of_token(cu_seqlens).to(logp.device)
    n = cu_seqlens.numel() - 1
    log_r = (logp - old_logp) * on
    seq_sum = torch.zeros(n, dtype=logp.dtype, device=logp.device).index_add(0, smp, log_r)
    seq_len = torch.zeros(n, dtype=logp.dtype, device=logp.device).index_add(0, smp, on).clamp(min=1.0)
    seq_log_ratio = (seq_sum / seq_len).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_ratio_t = seq_log_ratio.detach()[smp] + logp - logp.detach()
    ratio = torch.exp(log_ratio_t)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, {"clipped": (clipped > unclipped).to(logp.dtype), "ratio": ratio.detach()}


def cispo(logp, old_logp, advantages, *, mask=None, cu_seqlens=None, clip_low: float | None = None,
          clip_high: float = 0.28, **_):
    """CISPO (MiniMax-M1, 2025): clip the importance-sampling *weight*, not the update, and stop
    its gradient, so every token keeps a gradient::

        r_t    = exp(logp_t - old_logp_t)
        loss_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * logp_t

    ``clip_low`` None: no lower bound (the paper's choice)."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    low = 0.0 if clip_low is None else 1.0 - clip_low
    weight = ratio.clamp(low, 1.0 + clip_high)
    loss = -weight * advantages * logp
    return loss, {"clipped": (weight != ratio).to(logp.dtype), "ratio": ratio}
