"""Advantage estimators: per-token advantages (and returns) from rewards.

Every estimator is called with the same keyword arguments and ignores those it does not use:

* ``scores`` ``(n,)``: each sample's sequence reward (rule rewards, reward models, shaping);
* ``groups`` ``(n,)``: the prompt each sample answers (samples of one prompt form a group);
* ``mask`` ``(T,)``: 1 on the response tokens that are trained, 0 elsewhere;
* ``cu_seqlens`` ``(n + 1,)``: sample offsets in the packed token axis;
* ``token_rewards`` ``(T,)`` or None: per-token rewards on top of ``scores``, the KL penalty
  ``-beta * KL_t`` when the KL goes into the reward;
* ``values`` ``(T,)`` or None: a critic's values (prediction convention, see :func:`gae`);
* ``baseline`` ``(n,)`` or None: a per-sample baseline reward (ReMax: the reward of the greedy
  response to the same prompt);

plus the estimator's own options. It returns ``(advantages, returns)``, float32 ``(T,)``, 0 off
the mask; ``returns`` is None when the estimator has no value target.

Sequence-level estimators judge a sample by its **total** reward ``scores_i + sum_t
token_rewards_t`` (the KL in the reward summed over the sample's tokens). Statistics follow
:mod:`rlweave.algo_parts.stats` (float64, sample std, all-equal groups give exactly 0).
"""

from __future__ import annotations

import torch

from rlweave.algo_parts.stats import DEFAULT_EPS, group_moments, group_standardize, masked_whiten


def sample_of_token(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)``: the sample each packed token belongs to."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens)


def sequence_totals(scores: torch.Tensor, cu_seqlens: torch.Tensor, mask: torch.Tensor,
                    token_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``(n,)``: ``scores`` plus each sample's sum of ``token_rewards`` over the mask."""
    total = scores.reshape(-1).to(torch.float64)
    if token_rewards is not None:
        on = (mask > 0).to(torch.float64)
        total = total + torch.zeros_like(total).index_add_(0, sample_of_token(cu_seqlens),
                                                            token_rewards.to(torch.float64) * on)
    return total


def per_token(adv: torch.Tensor, cu_seqlens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample values ``(n,)`` broadcast to the sample's tokens, 0 off the mask, float32."""
    return (adv.to(torch.float64)[sample_of_token(cu_seqlens)] * (mask > 0).to(torch.float64)).to(torch.float32)


def grpo(*, scores, groups, mask, cu_seqlens, token_rewards=None, eps: float = DEFAULT_EPS, **_):
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (R_i - mean_g) / (std_g + eps)``, the
    group's sample std; a group whose rewards are all equal (a group of one included) gives 0."""
    total = sequence_totals(scores, cu_seqlens, mask, token_rewards)
    return per_token(group_standardize(total, groups, eps), cu_seqlens, mask), None


def dr_grpo(*, scores, groups, mask, cu_seqlens, token_rewards=None, **_):
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): ``A_i = R_i - mean_g``
    without the std division, which favours prompts that are too easy or too hard. Pairs with
    the constant-normaliser aggregation ``seq_mean_token_sum_norm`` (its default)."""
    total = sequence_totals(scores, cu_seqlens, mask, token_rewards)
    return per_token(group_moments(total, groups)[3], cu_seqlens, mask), None


def rloo(*, scores, groups, mask, cu_seqlens, token_rewards=None, **_):
    """RLOO (Ahmadian et al. 2024, "Back to basics"; Kool et al. 2019): each sample's baseline
    is the mean of the *other* samples of its group, ``A_i = R_i - (sum_g - R_i) / (k - 1) =
    k / (k - 1) * (R_i - mean_g)``; a group of one has no baseline and gives 0."""
    total = sequence_totals(scores, cu_seqlens, mask, token_rewards)
    count, _, _, centred = group_moments(total, groups)
    adv = torch.where(count > 1, centred * count / (count - 1).clamp(min=1.0), torch.zeros_like(centred))
    return per_token(adv, cu_seqlens, mask), None


def reinforce_pp(*, scores, mask, cu_seqlens, token_rewards=None, gamma: float = 1.0, eps: float = DEFAULT_EPS,
                 **_):
    """REINFORCE++ (Hu 2025): the return-to-go of per-token rewards (the sequence score on the
    last response token, the KL penalty ``token_rewards`` on every token),
    ``G_t = sum_{s >= t} gamma^(s-t) r_s``, whitened over every response token of the batch:
    ``A_t = (G_t - mean) / (std + eps)``. No group baseline: works with one sample per prompt.
    ``returns`` are the un-whitened ``G_t``."""
    returns = discounted_returns(token_level_rewards(scores, mask, cu_seqlens, token_rewards), mask, cu_seqlens,
                                 gamma)
    return masked_whiten(returns.to(torch.float64), mask, eps=eps).to(torch.float32), returns


def reinforce_pp_baseline(*, scores, groups, mask, cu_seqlens, token_rewards=None, eps: float = DEFAULT_EPS, **_):
    """REINFORCE++-baseline (Hu 2025): subtract the group mean from each sample's total reward,
    broadcast to its tokens, then whiten over every response token of the batch (the group mean
    removes the prompt's difficulty, the batch statistics keep the scale stable)."""
    total = sequence_totals(scores, cu_seqlens, mask, token_rewards)
    centred = per_token(group_moments(total, groups)[3], cu_seqlens, mask)
    return masked_whiten(centred.to(torch.float64), mask, eps=eps).to(torch.float32), None


def remax(*, scores, mask, cu_seqlens, token_rewards=None, baseline=None, **_):
    """ReMax (Li et al. 2023): ``A_i = R_i - R(greedy_i)``, the baseline being the reward of the
    greedy response to the same prompt (one extra greedy sample per prompt, which the algorithm
    generates and scores; ``baseline[i]`` is its reward for sample ``i``)."""
    if baseline is None:
        raise ValueError("advantage estimator 'remax' needs the greedy response's reward of every sample "
                         "(baseline=...); the algorithm generates it when the estimator declares needs=('baseline',)")
    total = sequence_totals(scores, cu_seqlens, mask, token_rewards)
    return per_token(total - baseline.reshape(-1).to(torch.float64), cu_seqlens, mask), None


def gae(*, scores, mask, cu_seqlens, token_rewards=None, values=None, gamma: float = 1.0, lam: float = 0.95, **_):
    """Generalised advantage estimation (Schulman et al. 2016), PPO's estimator. Each sample is
    an episode whose actions are its response tokens; the sequence score is paid on the last
    response token and ``token_rewards`` (the KL penalty) on every token; ``values[t]`` is the
    critic's estimate of the state from which token ``t`` is predicted, and the value after the
    last response token is 0 (no bootstrap)::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t          (the critic's regression target, returned)
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs a critic's values (an algorithm with a critic role, "
                         "such as ppo)")
    rewards = token_level_rewards(scores, mask, cu_seqlens, token_rewards)
    pos, smp, rank, width = response_layout(mask, cu_seqlens)
    n = cu_seqlens.numel() - 1
    adv = torch.zeros(mask.shape[0], dtype=torch.float32)
    ret = torch.zeros(mask.shape[0], dtype=torch.float32)
    if pos.numel() == 0:
        return adv, ret
    R = torch.zeros(n, width + 1, dtype=torch.float64)
    V = torch.zeros(n, width + 1, dtype=torch.float64)
    R[smp, rank] = rewards.to(torch.float64)[pos]
    V[smp, rank] = values.to(torch.float64)[pos]
    A = torch.zeros(n, width + 1, dtype=torch.float64)
    for t in range(width - 1, -1, -1):
        A[:, t] = R[:, t] + gamma * V[:, t + 1] - V[:, t] + gamma * lam * A[:, t + 1]
    adv[pos] = A[smp, rank].to(torch.float32)
    ret[pos] = (A[smp, rank] + V[smp, rank]).to(torch.float32)
    return adv, ret


# ---------------------------------------------------------------- token-level helpers
def response_layout(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                           torch.Tensor, int]:
    """``(pos, sample, rank, width)``: packed positions of the response tokens, their sample,
    their rank among the sample's response tokens, and the most response tokens of a sample."""
    smp_all = sample_of_token(cu_seqlens)
    on = mask > 0
    pos = torch.nonzero(on, as_tuple=False).reshape(-1)
    smp = smp_all[pos]
    n = cu_seqlens.numel() - 1
    first = torch.full((n,), mask.shape[0], dtype=torch.long).scatter_reduce(0, smp, pos, "amin")
    csum = torch.cumsum(on.long(), 0)
    before = torch.zeros(n, dtype=torch.long)
    has = first < mask.shape[0]
    before[has] = csum[first[has]] - 1
    rank = csum[pos] - 1 - before[smp]
    counts = torch.zeros(n, dtype=torch.long).index_add_(0, smp, torch.ones_like(smp))
    return pos, smp, rank, int(counts.max()) if counts.numel() else 0


def last_response_index(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(n,)``: packed index of each sample's last response token, -1 when it has none."""
    pos, smp, _, _ = response_layout(mask, cu_seqlens)
    out = torch.full((cu_seqlens.numel() - 1,), -1, dtype=torch.long)
    if pos.numel():
        out.scatter_reduce_(0, smp, pos, reduce="amax", include_self=True)
    return out


def token_level_rewards(scores: torch.Tensor, mask: torch.Tensor, cu_seqlens: torch.Tensor,
                        token_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """float32 ``(T,)``: ``token_rewards`` on the response tokens plus each sample's score on its
    last response token (a sample with no response token gets nothing: no action to credit)."""
    on = (mask > 0).to(torch.float64)
    r = torch.zeros(mask.shape[0], dtype=torch.float64)
    if token_rewards is not None:
        r = r + token_rewards.to(torch.float64) * on
    last = last_response_index(mask, cu_seqlens)
    ok = last >= 0
    r[last[ok]] += scores.reshape(-1).to(torch.float64)[ok]
    return r.to(torch.float32)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, cu_seqlens: torch.Tensor,
                       gamma: float = 1.0) -> torch.Tensor:
    """float32 ``(T,)``: ``G_t = sum_{s >= t} gamma^(s-t) r_s`` over each sample's response
    tokens, 0 off the mask."""
    pos, smp, rank, width = response_layout(mask, cu_seqlens)
    out = torch.zeros(mask.shape[0], dtype=torch.float32)
    if pos.numel() == 0:
        return out
    n = cu_seqlens.numel() - 1
    R = torch.zeros(n, width + 1, dtype=torch.float64)
    R[smp, rank] = rewards.to(torch.float64)[pos]
    G = torch.zeros(n, width + 1, dtype=torch.float64)
    for t in range(width - 1, -1, -1):
        G[:, t] = R[:, t] + gamma * G[:, t + 1]
    out[pos] = G[smp, rank].to(torch.float32)
    return out
