"""Normalisation of PPO advantages and rewards, with the one convention of
:mod:`rlweave.algo_parts.stats` (float64, sample standard deviation, ``eps`` added to it, all
equal values give exactly 0).

**Advantages are whitened with global statistics.** The single controller holds the whole
step's batch before anything is scattered to data-parallel ranks, so
:func:`~rlweave.algo_parts.stats.masked_whiten` computes the mean and standard deviation over
*every* response token of the batch on the controller, and the ranks receive already-normalised
advantages. This is the same result an
all-reduce of (count, sum, sum of squares) across ranks would give, without a collective,
and it does not depend on how the batch is later split into mini-batches or ranks.

**Rewards (sequence scores)** can be normalised per batch, with running statistics across
steps (:class:`RunningMoments`, checkpointed), and clipped to ``[-clip, clip]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlweave.algo_parts.stats import DEFAULT_EPS, group_standardize, masked_moments


class RunningMoments:
    """Running mean and sample variance over every value seen (Chan et al. parallel update)."""

    def __init__(self) -> None:
        self.count = 0.0
        self.mean = 0.0
        self.m2 = 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def update(self, x: torch.Tensor) -> None:
        v = x.double().reshape(-1)
        nb = float(v.numel())
        if nb == 0:
            return
        mb = float(v.mean())
        m2b = float(((v - mb) ** 2).sum())
        total = self.count + nb
        delta = mb - self.mean
        self.mean += delta * nb / total
        self.m2 += m2b + delta * delta * self.count * nb / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.mean, self.m2 = float(state["count"]), float(state["mean"]), float(state["m2"])


REWARD_NORMS = ("none", "batch", "running", "group")


def normalize_scores(
    scores: torch.Tensor,
    mode: str = "none",
    running: RunningMoments | None = None,
    clip: float | None = None,
    eps: float = DEFAULT_EPS,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sequence scores after normalisation then clipping.

    ``none``: unchanged. ``batch``: ``(s - mean) / (std + eps)`` over this batch.
    ``running``: update ``running`` with this batch, then ``(s - mean) / (std + eps)`` with
    the running statistics. ``group``: ``(s - mean_g) / (std_g + eps)`` inside each group
    (``groups[i]``: the prompt of sample ``i``; a group of one, or of equal scores, gets 0), which
    removes a reward model's per-prompt offset. ``clip``: clamp to ``[-clip, clip]`` afterwards
    (None: no clip).
    """
    s = scores.float()
    if mode == "batch":
        mean, std = masked_moments(s, torch.ones_like(s))
        s = ((s.double() - mean) / (std + eps)).float() if std > 0 else torch.zeros_like(s)
    elif mode == "running":
        if running is None:
            raise ValueError("normalize_scores: mode 'running' needs a RunningMoments")
        running.update(s)
        s = (s - running.mean) / (running.std + eps)
    elif mode == "group":
        if groups is None:
            raise ValueError("normalize_scores: mode 'group' needs the group of every sample")
        s = group_standardize(s, groups, eps).to(torch.float32)
    elif mode != "none":
        raise ValueError(f"unknown reward normalisation {mode!r}; choose one of {', '.join(REWARD_NORMS)}")
    if clip is not None:
        s = s.clamp(-clip, clip)
    return s


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over the mask (1: perfect critic, 0: no better than a
    constant, negative: worse). NaN when the returns have no variance."""
    _, std_r = masked_moments(returns, mask)
    _, std_d = masked_moments(returns - values, mask)
    if std_r == 0.0:
        return float("nan")
    return 1.0 - (std_d**2) / (std_r**2)
