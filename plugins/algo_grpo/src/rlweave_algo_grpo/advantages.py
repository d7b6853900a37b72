"""Group-relative advantages: each response is judged against the other responses to the
same prompt, so no critic is needed.

``A_i = (r_i - mean_g) / (std_g + eps)`` with the sample std of the group (GRPO), or
``A_i = r_i - mean_g`` without the division (Dr.GRPO: the division favours prompts that
are too easy or too hard). A group of one response has advantage 0.
"""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sample advantages ``(n,)`` from per-sample ``rewards`` and group indices."""
    rewards = rewards.float()
    _, inv = torch.unique(groups, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(k).index_add_(0, inv, rewards) / count
    centred = rewards - mean[inv]
    if not scale:
        return centred
    var = torch.zeros(k).index_add_(0, inv, centred.pow(2)) / (count - 1).clamp(min=1)
    denom = var.sqrt()[inv] + eps
    return torch.where(denom > 0, centred / denom.clamp(min=1e-12), torch.zeros_like(centred))


def group_std(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Sample std of each sample's group, per sample ``(n,)`` (0 for groups of one)."""
    rewards = rewards.float()
    _, inv = torch.unique(groups, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(k).index_add_(0, inv, rewards) / count
    var = torch.zeros(k).index_add_(0, inv, (rewards - mean[inv]).pow(2)) / (count - 1).clamp(min=1)
    return var.sqrt()[inv]
