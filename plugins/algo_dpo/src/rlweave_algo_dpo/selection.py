"""OnlineDPO pair formation: best versus worst sample of each prompt, ties never used.

A prompt gives a pair only when its best reward is *strictly* above its worst by more than
``min_reward_gap`` (so two samples with identical rewards are never a preference); every
other prompt is counted as tied (reported as ``tied_prompts``), never dropped silently.
Among equal best (or equal worst) samples the first one wins, so selection is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class PairSelection:
    """``pairs``: ``(prompt_index, chosen_k, rejected_k)``; ``tied``: indices of prompts whose
    usable samples all tie (or that have fewer than two usable samples: ``too_few``)."""

    pairs: list[tuple[int, int, int]] = field(default_factory=list)
    tied: list[int] = field(default_factory=list)
    too_few: list[int] = field(default_factory=list)


def select_pairs(
    rewards: Sequence[Sequence[float]],
    usable: Sequence[Sequence[bool]] | None = None,
    min_reward_gap: float = 0.0,
) -> PairSelection:
    """Best-vs-worst pairs per prompt from per-prompt reward lists. ``usable[i][k]`` False
    excludes a sample (empty or failed generation) from both ends of a pair."""
    if min_reward_gap < 0:
        raise ValueError(f"min_reward_gap must be >= 0, got {min_reward_gap}")
    out = PairSelection()
    for i, rs in enumerate(rewards):
        ok = [k for k in range(len(rs)) if usable is None or usable[i][k]]
        if len(ok) < 2:
            out.too_few.append(i)
            continue
        best = max(ok, key=lambda k: (rs[k], -k))
        worst = min(ok, key=lambda k: (rs[k], k))
        if rs[best] - rs[worst] > min_reward_gap and rs[best] != rs[worst]:
            out.pairs.append((i, best, worst))
        else:
            out.tied.append(i)
    return out
