"""Generalised advantage estimation (Schulman et al. 2016) over packed response tokens.

Each sample of a packed batch is one episode whose actions are its response tokens (the
positions where ``mask > 0``, in order). Values follow the prediction convention:
``values[t]`` is the critic's estimate of the state from which ``input_ids[t]`` is
predicted. The sequence-level reward sits on the last response token (see
:func:`token_rewards`); the episode ends there, so the value *beyond* the last response
token is 0 (no bootstrap), whether the response stopped at EOS or at the length limit.

    delta_t = r_t + gamma * V_{t+1} - V_t            (V after the last token = 0)
    A_t     = delta_t + gamma * lam * A_{t+1}        (A after the last token = 0)
    R_t     = A_t + V_t                              (the critic's regression target)

Everything off the mask (prompt tokens) is 0 in the outputs.
"""

from __future__ import annotations

import torch


def _response_layout(
    mask: torch.Tensor, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Positions of the response tokens, their sample and their rank inside the sample."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    sample = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    on = mask > 0
    pos = torch.nonzero(on, as_tuple=False).reshape(-1)
    smp = sample[pos]
    # rank of each response token inside its sample: running count of mask minus the count before the sample
    csum = torch.cumsum(on.long(), 0)
    before = torch.zeros(lens.numel(), dtype=torch.long)
    starts = cu_seqlens[:-1]
    nonempty = lens > 0
    before[nonempty] = csum[starts[nonempty]] - on.long()[starts[nonempty]]
    rank = csum[pos] - 1 - before[smp]
    n_resp = torch.zeros(lens.numel(), dtype=torch.long).index_add_(0, smp, torch.ones_like(smp))
    width = int(n_resp.max()) if n_resp.numel() else 0
    return pos, smp, rank, width


def last_response_index(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(n,)``: packed index of each sample's last response token, -1 when the sample
    has none."""
    n = cu_seqlens.numel() - 1
    pos, smp, _, _ = _response_layout(mask, cu_seqlens)
    out = torch.full((n,), -1, dtype=torch.long)
    if pos.numel():
        out.scatter_reduce_(0, smp, pos, reduce="amax", include_self=True)
    return out


def token_rewards(
    scores: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards ``(T,)``: ``-kl_coef * kl`` on every response token plus each
    sample's scalar ``scores[i]`` on its last response token. A sample without a response
    token gets nothing (it has no action to credit)."""
    r = torch.zeros(mask.shape[0], dtype=torch.float32)
    on = (mask > 0).float()
    if kl is not None and kl_coef:
        r = r - kl_coef * kl.float() * on
    last = last_response_index(mask, cu_seqlens)
    ok = last >= 0
    r[last[ok]] += scores.float()[ok]
    return r


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``(T,)``, 0 off the mask.

    The per-sample recursion runs on a padded ``(n, max_response_len)`` view in which
    positions past a sample's last response token hold 0 for both reward and value, which
    is exactly the "episode ended" boundary condition.
    """
    if not (rewards.shape == values.shape == mask.shape):
        raise ValueError(
            f"compute_gae: shapes differ: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    n = cu_seqlens.numel() - 1
    pos, smp, rank, width = _response_layout(mask, cu_seqlens)
    adv = torch.zeros(mask.shape[0], dtype=torch.float32)
    ret = torch.zeros(mask.shape[0], dtype=torch.float32)
    if pos.numel() == 0:
        return adv, ret
    R = torch.zeros(n, width + 1, dtype=torch.float32)
    V = torch.zeros(n, width + 1, dtype=torch.float32)
    R[smp, rank] = rewards.float()[pos]
    V[smp, rank] = values.float()[pos]
    A = torch.zeros(n, width + 1, dtype=torch.float32)
    for t in range(width - 1, -1, -1):
        delta = R[:, t] + gamma * V[:, t + 1] - V[:, t]
        A[:, t] = delta + gamma * lam * A[:, t + 1]
    adv[pos] = A[smp, rank]
    ret[pos] = adv[pos] + values.float()[pos]
    return adv, ret
